"""A whole model as data (issue 34): :mod:`.plan` (the :class:`~.plan.ModelPlan` record: kernel steps and ATen
steps in the problem graph's order, ATen ops only from :data:`~.aten.ALLOWED`), :mod:`.execute` (runs a plan on
tensors, kernels through an injected launcher), :mod:`.check` (end to end against the problem's own forward, with
the harness's rules) and :mod:`.bench` (end-to-end timing beside eager and torch.compile).

It lives in the harness because it is what a GPU worker and ``kerngen.load`` execute: the agent (the playbook)
only builds plans, the results layer only shows and loads them."""
