"""Pure tensor code shared by every layer: the Batch type and the math of the RL step.

No Ray, no models: functions on torch tensors, each module opening with its equations.

- `batch`: the `Batch` that crosses role boundaries.
- `choices`: typed enums a config chooses from (estimator, policy loss, aggregation, KL estimator/control).
- `advantages`: GAE, GRPO, Dr.GRPO, RLOO, REINFORCE++ (with and without group baseline), ReMax, OPO;
  one entry point `compute_advantages(estimator, inputs, params)`.
- `policy_loss`: PPO (asymmetric clip, dual clip), GSPO, REINFORCE, truncated importance weights.
- `loss_agg`: token-mean, token-sum and the seq-mean modes, with global denominators for gradient
  accumulation.
- `value_loss`: clipped value loss.
- `kl`: KL estimators (every verl name: kl/k1, abs, mse/k2, low_var_kl/k3 with verl's clamps, and the
  straight-through `+` variants), KL loss term, in-reward KL penalty, fixed and adaptive controllers.
- `contracts`: what an estimator or a policy loss receives and returns (built in or registered).
- `registry`: `@register_estimator` / `@register_policy_loss` for user modules (`algorithm.custom_module`).
- `entropy`: chunked, stable entropy from logits and the entropy bonus.
- `reward_shaping`: outcome-score placement, DAPO overlong penalty, DAPO dynamic-sampling filter.
- `metrics`: masked reductions and the standard metric names (verl's where they exist).
"""
