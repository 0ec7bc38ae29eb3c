"""Worker checkpoints (FSDP2 model, optimizer, LR scheduler, RNG) and Hugging Face export."""

from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

__all__ = ["FSDPCheckpointManager"]
