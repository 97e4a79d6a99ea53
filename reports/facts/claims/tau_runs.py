# Paper B's tau claim, widened: the rank-32 reference database, layers d_model = d_qk = d_vo in 2..16,
# 3 init seeds, lr 1e-2 and 3e-2, 2000 full-batch epochs (the paper's budget).
import time

import torch

from auditor.lab.experiment import get, run_experiment
from auditor.lab.facts.shared import REFERENCE_DB

torch.set_num_threads(1)
e = get("facts tau")
for lr in (1e-2, 3e-2):
    t0 = time.time()
    config = e.make("reference", db=REFERENCE_DB, lr=lr, steps=2000, d_models=(2, 3, 4, 5, 6, 8, 16))
    frame, text = run_experiment(e, config, f"runs/lab2/tau-wide-lr{lr:g}", progress=False)
