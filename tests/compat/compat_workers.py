"""Worker classes for the compat Ray test (pickled by value into the Ray workers)."""

import os

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register


class EnvWorker(Worker):
    """Reports environment variables as seen inside the worker process, and at construction time."""

    def __init__(self):
        super().__init__()
        self.seen_at_init = os.environ.get("COMPAT_FLAG")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def read_env(self, keys):
        return {k: os.environ.get(k) for k in keys} | {"at_init": self.seen_at_init}
