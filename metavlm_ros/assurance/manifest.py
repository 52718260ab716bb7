"""SHA256SUMS manifests, as assurance reads them (common/manifest.py: a campaign writes them too)."""

from metavlm_ros.common.manifest import MANIFEST, check_manifest, manifest_files, write_manifest

__all__ = ['MANIFEST', 'check_manifest', 'manifest_files', 'write_manifest']
