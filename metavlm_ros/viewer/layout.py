"""The Foxglove layout in config/: source, annotated follow-up, objectives, violations, /diagnostics."""

from __future__ import annotations

import json

import foxglove.layouts as fl

from metavlm_ros.viewer.channels import topic_names

__all__ = ['LAYOUT_FILE', 'build_layout']

LAYOUT_FILE = 'foxglove_layout.json'


def _image(topic: str, annotations: str | None = None) -> fl.ImagePanel:
    shown = {annotations: fl.ImageAnnotationSettings(visible=True)} if annotations else None
    return fl.ImagePanel(
        config=fl.ImageConfig(image_mode=fl.ImageModeConfig(image_topic=topic, annotations=shown))
    )


def build_layout(prefix: str = '/metavlm') -> str:
    """The layout as Foxglove's JSON (pretty-printed), for the topics under `prefix`.

    Built with the SDK's own layout model, so that the file follows Foxglove's layout format.
    """
    topics = topic_names(prefix)
    violations = topics['violations']
    images = fl.SplitContainer(
        direction='column',
        items=[
            fl.SplitItem(proportion=1, content=_image(topics['source'])),
            fl.SplitItem(proportion=1, content=_image(topics['followup'], topics['annotations'])),
        ],
    )
    plot = fl.PlotPanel(
        config=fl.PlotConfig(
            paths=[
                fl.PlotSeries(value=f'{violations}.f_trans', label='f_trans (minimised)'),
                fl.PlotSeries(value=f'{violations}.f_pred', label='f_pred (maximised)'),
            ],
            show_legend=True,
        )
    )
    evidence = fl.SplitContainer(
        direction='column',
        items=[
            fl.SplitItem(proportion=1, content=plot),
            fl.SplitItem(proportion=1, content=fl.TablePanel(config=fl.TableConfig(topic_path=violations))),
            fl.SplitItem(
                proportion=1,
                content=fl.DiagnosticsSummaryPanel(
                    config=fl.DiagnosticsSummaryConfig(topic_to_render='/diagnostics')
                ),
            ),
        ],
    )
    layout = fl.Layout(
        content=fl.SplitContainer(
            direction='row',
            items=[fl.SplitItem(proportion=1, content=images), fl.SplitItem(proportion=1, content=evidence)],
        )
    )
    return json.dumps(json.loads(layout.to_json()), indent=2) + '\n'


if __name__ == '__main__':
    # python -m metavlm_ros.viewer.layout > config/foxglove_layout.json regenerates the shipped file.
    print(build_layout(), end='')
