"""Search-R1's format-reward entry: ``python -m verl.trainer.main_ppo_format key=value ...``.

The same trainer as :mod:`verl.trainer.main_ppo` with ``reward_model.style=format``: the training
reward is Search-R1's format-aware EM (``structure_format_score``, ``final_format_score``,
``retrieval_score``; Search-R1's environment defines it). Its v0.3 scripts call this module.
"""

from verl.trainer.main_ppo import main

if __name__ == "__main__":
    main(defaults=["reward_model.style=format"])
