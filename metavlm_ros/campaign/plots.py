"""The report's plots: PNG figures of a campaign's results."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from metavlm_ros.campaign.anytime import anytime_band, references
from metavlm_ros.campaign.loading import SOLUTION_SETS, CampaignResults, hypervolumes, non_identity
from metavlm_ros.campaign.tables import APPROACH, criterion_label
from metavlm_ros.common.document import slug
from metavlm_ros.method.metrics import non_dominated

__all__ = [
    'make_plots',
]


def make_plots(results: CampaignResults, out: Path) -> list[tuple[str, Path]]:
    """PNG plots under out/plots: non-dominated sets and anytime hypervolume per image, VR by order,
    hypervolume distributions."""
    import matplotlib

    matplotlib.use('Agg')  # files only: no display on robots, CI or cluster nodes
    import matplotlib.pyplot as plt

    plots_dir = out / 'plots'
    plots_dir.mkdir(parents=True, exist_ok=True)
    written: list[tuple[str, Path]] = []
    colours = {'nsga2': 'tab:blue', 'random': 'tab:orange', 'nsga3': 'tab:green', 'smsemoa': 'tab:red',
               'moead': 'tab:purple', 'mobo': 'tab:brown'}  # fmt: skip

    def save(fig, name: str, title: str) -> None:
        path = plots_dir / f'{name}.png'
        fig.savefig(path, dpi=90, bbox_inches='tight')
        plt.close(fig)
        written.append((title, path))

    for model in results.models:
        if results.kind(model) is None:
            continue
        for image in results.images:
            cells = results.of(model, image=image)
            if not cells:
                continue
            fig, ax = plt.subplots(figsize=(5.5, 4))
            for algorithm in results.algorithms:
                front_cells = [c for c in cells if c.algorithm == algorithm]
                points = np.asarray([p for c in front_cells for p in c.front], dtype=float).reshape(-1, 2)
                if points.size == 0:
                    continue
                label = APPROACH.get(algorithm, algorithm)
                colour = colours.get(algorithm)
                ax.scatter(
                    points[:, 0], points[:, 1], s=12, alpha=0.35, color=colour, label=f'{label} (runs)'
                )
                front = points[non_dominated(points[:, 0], points[:, 1])]
                front = front[np.argsort(front[:, 0])]
                ax.step(front[:, 0], front[:, 1], where='post', color=colour, label=f'{label} (union front)')
            ax.set_xlabel('f_trans (minimise)')
            ax.set_ylabel('f_pred (maximise)')
            ax.set_title(f'{model} / {image}: non-dominated sets')
            ax.legend(fontsize=7)
            save(fig, f'front-{slug(model)}-{slug(image)}', f'Non-dominated sets, {model}, {image}')
            _anytime_plot(plt, cells, results, model, image, colours, save)

        criteria = results.criteria(model)
        fig, axes = plt.subplots(1, len(criteria), figsize=(4.5 * len(criteria), 3.5), squeeze=False)
        width = 0.8 / max(1, len(results.algorithms))
        for ax, criterion in zip(axes[0], criteria, strict=True):
            for i, algorithm in enumerate(results.algorithms):
                records = non_identity(results.of(model, algorithm))
                rates = []
                for order in results.orders:
                    flags = [bool(r['violation'].get(criterion)) for r in records if r['order'] == order]
                    rates.append(sum(flags) / len(flags) if flags else math.nan)  # no bar: nothing judged
                offset = (i - (len(results.algorithms) - 1) / 2) * width
                ax.bar(np.array(results.orders) + offset, rates, width,
                       color=colours.get(algorithm), label=APPROACH.get(algorithm, algorithm))  # fmt: skip
            ax.set_xlabel('composition order')
            ax.set_ylabel('violation rate')
            ax.set_ylim(0, 1.15)  # headroom for the legend above the bars
            ax.set_xticks(results.orders)
            ax.set_xlim(0.5, len(results.orders) + 0.5)
            ax.set_title(criterion_label(criterion))
            ax.legend(fontsize=7, loc='upper left', ncol=2)
        fig.suptitle(f'{model}: violation rate by order ({SOLUTION_SETS[results.solutions].split(" (")[0]})')
        fig.tight_layout()
        save(fig, f'vr-{slug(model)}', f'Violation rate by order, {model}')

        data, labels, colour_list = [], [], []
        for image in results.images:
            for algorithm in results.algorithms:
                values = hypervolumes(results.of(model, algorithm, image))
                if values:
                    data.append(values)
                    labels.append(f'{image}\n{APPROACH.get(algorithm, algorithm)}')
                    colour_list.append(colours.get(algorithm, 'grey'))
        if data:
            fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(data)), 3.8))
            boxes = ax.boxplot(data, patch_artist=True)
            ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
            for patch, colour in zip(boxes['boxes'], colour_list, strict=True):
                patch.set_facecolor(colour)
                patch.set_alpha(0.5)
            ax.set_ylabel('hypervolume')
            ax.set_title(f'{model}: hypervolume across runs')
            save(fig, f'hv-{slug(model)}', f'Hypervolume distributions, {model}')
    return written


def _anytime_plot(plt, cells, results: CampaignResults, model: str, image: str, colours: dict, save) -> None:
    """Hypervolume against evaluations: the median over runs and the band from lowest to highest."""
    budget = max((c.anytime[-1][0] for c in cells if c.anytime), default=0)
    if not budget:
        return
    grid = np.arange(1, budget + 1)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for algorithm in results.algorithms:
        median, low, high = anytime_band([c for c in cells if c.algorithm == algorithm], grid)
        if np.all(np.isnan(median)):
            continue
        colour = colours.get(algorithm)
        ax.plot(grid, median, color=colour, label=APPROACH.get(algorithm, algorithm))
        ax.fill_between(grid, low, high, color=colour, alpha=0.2, linewidth=0)
    reference = references(results, model).get(image)
    if reference is not None:
        ax.axhline(reference, color='grey', linestyle='--', linewidth=0.8, label="MetaVLM's final (median)")
    ax.set_xscale('log')
    ax.set_xlabel('evaluations (model judgements)')
    ax.set_ylabel('hypervolume')
    ax.set_title(f'{model} / {image}: anytime hypervolume (median, min-max over runs)')
    ax.legend(fontsize=7)
    save(fig, f'anytime-{slug(model)}-{slug(image)}', f'Anytime hypervolume, {model}, {image}')
