"""How the native module resolves asyncio futures from its own threads."""

import asyncio


def new_future():
    loop = asyncio.get_running_loop()
    return loop, loop.create_future()


def resolve(loop, future, ok, value):
    def settle():
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        # The loop is closed: nobody is waiting any more.
        pass


def on_cancel(future, abort):
    future.add_done_callback(lambda f: abort() if f.cancelled() else None)
