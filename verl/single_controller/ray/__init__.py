"""Ray backend of the single controller."""

from verl.single_controller.base.host import create_colocated_worker_cls
from verl.single_controller.ray.init import init_ray
from verl.single_controller.ray.resource_pool import RayResourcePool
from verl.single_controller.ray.worker_group import RayClassWithInitArgs, RayWorkerGroup

__all__ = ["RayClassWithInitArgs", "RayResourcePool", "RayWorkerGroup", "create_colocated_worker_cls", "init_ray"]
