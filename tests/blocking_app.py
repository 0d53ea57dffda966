"""A tiny app for the worker supervisor's tests (tests/test_serve_workers.py): ``/pid`` says
which process answered, ``/block`` blocks its event loop for good, as a hung worker would."""

from __future__ import annotations

import os
import time

from fastapi import FastAPI


def app() -> FastAPI:
    served = FastAPI()

    @served.get("/pid")
    async def pid() -> dict[str, int]:
        return {"pid": os.getpid()}

    @served.get("/block")
    async def block() -> None:
        time.sleep(3600)  # on the event loop: nothing else runs in this process

    return served
