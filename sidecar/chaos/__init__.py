"""`mqfed chaos`: fault scenarios under traced load, checked by the delivery audit.

`scenarios` (pure: what each scenario does and promises, the verdict, the table), `cluster`
(a running local cluster as a drill sees it), `faults` (how each fault is done and undone),
`proxy` (the delaying proxy of the slow link), `runner` (one scenario start to verdict).
"""
