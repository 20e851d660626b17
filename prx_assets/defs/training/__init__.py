"""Training: ``training_run`` (a SLURM job through Pipes) and the sensor that launches it."""

from prx_assets.defs.training.assets import TrainingConfig, training_run
from prx_assets.defs.training.sensors import training_sensor

__all__ = ['TrainingConfig', 'training_run', 'training_sensor']
