"""gwtfp2p.model: transformers GPT-2 / Llama split into data-holder head+tail and relay stages.

What the daemon uses (import from the submodules; this package imports nothing eagerly):
``replica.make_stage_executor`` / ``replica.make_data_holder_executor`` build a node's part from a
``RunSpec``; ``executor.StageExecutor`` and ``head_tail.DataHolderExecutor`` run microbatches by
id; ``Trainable.grad_contribution`` / ``reduce`` / ``grad_sq_norm`` / ``apply_mean`` aggregate and
step (``gradnorm.global_sq_norm`` joins the parts' norms); ``losssum.LossSum`` sums losses exactly;
``state_bytes`` / ``load_state_bytes`` / ``state_hash`` move and check state; ``data`` and
``tokenizer`` make microbatches; ``harness.PipelineHarness`` is the no-network reference. See
docs/model.md.
"""
