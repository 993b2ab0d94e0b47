"""The probe's child: ``python -m opro.llm.probe MODEL MODE`` loads MODEL with extra buffers MODE and decodes
a few tokens, alone and batched (see :mod:`opro.llm.probe`).

Its own module because it drives the backend: :mod:`opro.llm.llamacpp` runs the probe before a load,
so the probe's functions cannot import the backend back; only this entry point does.
"""

from __future__ import annotations

import json
import sys

from opro.llm.client import GenerationOptions, Message
from opro.llm.llamacpp import LlamaCppLLM


def _main(argv: list[str]) -> int:
    """``MODEL MODE``: MODE "on" / "off" is the probe itself (no probe inside); "auto" is what opro does
    by default, probe included (the test suite runs it in a child so that a crash fails a test)."""
    path, mode = argv
    llm = LlamaCppLLM(
        model_path=path, extra_buffers=mode, probe=mode == "auto", verbose=mode != "auto", n_ctx=1024, batch_width=2
    )
    context = " ".join(f"Fact {i}: the river passes the town of Alder at mile {i * 7}." for i in range(4))
    user = Message("user", f"Context: {context}\nQuestion: at which mile does the river pass Alder in fact 3?")
    greedy = GenerationOptions(temperature=0.0, max_tokens=4)
    llm.generate((Message("system", "Answer briefly."), user), greedy)
    llm.generate_many([((Message("system", "Answer briefly."), user), greedy), ((Message("system", "Be brief."), user), greedy)])
    threads = llm.threads_now
    llm.close()
    print(json.dumps({"ok": True, "extra_buffers": getattr(llm.probed, "mode", mode), "threads": threads}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
