"""The fixed campaign results the report tests read (test/fixtures/campaign_results); values by hand.

Per cell, the fixture's solutions are (see make_fixture.py), with order-0 and failed ones left out:
CLIP MetaVLM: {1} o1 v(1%), {2,3} o2 v(1,3%), {2,3} o2 v(1,3,5%), {1,2,5} o3 v(1,3%);
CLIP Rand: {1} o1 -, {1,3} o2 v(1%), {1..6} o6 v(1,3,5%), {2,3} o2 v(1%);
BLIP MetaVLM: {3} o1 v, {3,4} o2 -, {3} o1 v; BLIP Rand: {5} o1 -, {2,6} o2 v, {1,2,4} o3 -, {3} o1 -.
Every model and algorithm has 8 cells (2 images x 4 runs), so counts are 8 times the per-cell ones.
"""

from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / 'fixtures' / 'campaign_results'
