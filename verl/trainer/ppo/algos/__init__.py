"""PPO-family algorithms as pure tensor functions; ``verl.trainer.ppo.core_algos`` re-exports them.

Modules: ``masked`` (masked statistics, loss aggregation), ``advantage`` (estimator registry),
``policy_loss`` (policy-loss registry, value loss), ``kl`` (KL estimators and controllers,
entropy), ``importance_sampling`` (rollout/trainer truncated IS).
"""
