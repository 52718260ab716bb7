"""The report's plots (campaign/plots.py): which PNGs a campaign gets, drawn from its loaded results."""

from metavlm_ros.campaign.loading import load_results
from metavlm_ros.campaign.plots import make_plots
from test.campaign.campaign_results import FIXTURE


def test_one_front_per_model_and_image_and_one_rate_and_one_hypervolume_plot_per_model(tmp_path):
    results = load_results(FIXTURE)
    plots = make_plots(results, tmp_path)
    paths = [path for _, path in plots]
    # Two models and two images: four fronts, then a VR plot and an HV plot per model.
    assert len(paths) == len(set(paths)) == 2 * 2 + 2 + 2
    assert all(path.parent == tmp_path / 'plots' for path in paths)
    assert all(path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' for path in paths)
    assert {path.name for path in paths} >= {'hv-clip_tiny.png', 'hv-blip_tiny.png'}
    assert all(title for title, _ in plots)
