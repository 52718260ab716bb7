"""A small campaign configuration over a folder of images, for the campaign tests."""

from metavlm_ros.campaign.config import parse_config


def small_config(image_dir, model_dir, **overrides):
    data = {
        'frames': {'sources': [str(image_dir)]},
        'models': [{'backend': 'clip', 'model': str(model_dir), 'name': 'tiny-clip', 'device': 'cpu'}],
        'runs': 2,
        'population': 6,
        'evaluations': 24,
        'seed': 5,
    }
    data.update(overrides)
    return parse_config(data, base_dir=image_dir.parent)
