"""Four costs of thunder 0.2.6's bytecode interpreter that a first call pays, removed.

A model's first call spends most of its time in thunder's interpreter acquiring the
trace (``thunder_general_jit``; pythia's tiny config on the CPU machine: 15.3 s of 18.4
under cProfile). Four of its costs do no work a trace needs:

- **Builtins looked up through interpreted code.** ``LOAD_GLOBAL`` of a builtin
  (``hasattr``, ``getattr``, ``type``, ``len``: thunder interprets its own lookasides, whose
  code calls them all the time) runs ``globals_lookup``, which interprets
  ``lambda d, k: d[k]`` twice, once for the module's ``__builtins__`` and once for the name:
  two interpreted frames, each an interpreted ``dict.__getitem__``, about 0.85 ms a lookup
  on the CPU machine. pythia's tiny first call made 4,061 of them, 3.5 s of its 7.6. A
  builtin is no input of the program: thunder never unpacks or checks one in the prologue
  (its wrap callback flags callables and constants as such), so where the module's
  builtins are Python's own the value is wrapped as the constant it is and nothing else
  changes. A name the module defines itself still takes thunder's path, so a global tensor
  or number keeps its provenance for the prologue.
- **Every frame disassembled anew.** ``_run_frame`` calls ``dis.get_instructions`` on its
  code each time it runs a frame (4,566 frames a pythia first call, most of them the same
  few lookaside bodies); the instructions of a code object never change, so they are
  computed once per code object.
- **A 5 ms wait for each Python frame it makes.** Where interpreted code raises (an
  ``AttributeError`` under ``hasattr``, a ``StopIteration``), thunder makes a real Python
  frame for the traceback in a new thread and waits for it by spinning on a list; the
  spinning thread holds the GIL until the interpreter's switch interval (5 ms) hands it
  over, so each frame costs 5.5 ms where the work takes 0.2 ms (transformers' Llama, tiny:
  277 frames, 1.5 s). The switch interval is lowered for that wait alone and restored.
- **The whole call stack read from source, for one frame of it.** Each trace's interpreter
  context keeps its caller's ``FrameInfo`` (``inspect.stack()[2]``), and ``inspect.stack()``
  builds a ``FrameInfo`` for every frame up to the interpreter's bottom, each finding its
  module (a walk over ``sys.modules``) and reading its source line. Under pytest (60
  frames) that was 25 ms of a 96 ms jit of one binary op on the CPU machine. The
  interpreter gets an ``inspect`` whose ``stack()`` builds each ``FrameInfo`` only when it
  is indexed, the same one ``inspect.stack()`` builds for that frame.

All four are installed only on the thunder these were read from (0.2.6) and only where its
functions are the ones read; ``THUNDER_FUSER_FAST_INTERPRETER=0`` leaves thunder as it is
(to measure against, or to rule these out).
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import sys
import types

from thunder_fuser._compat import thunder_0_2_6

_MISSING = object()
_BUILTINS = builtins.__dict__


class _ModuleFor(types.ModuleType):
    """A module of Python's for thunder's interpreter: every name of ``module`` copied in
    (the interpreter reads ``dis.opmap`` and the like half a million times a first call: no
    ``__getattr__`` on that path), but those the subclass defines."""

    def __init__(self, module: types.ModuleType):
        super().__init__(module.__name__)
        own = vars(type(self))
        self.__dict__.update({k: v for k, v in vars(module).items() if k not in own})


class _DisWithCachedInstructions(_ModuleFor):
    """``dis`` for thunder's interpreter: ``get_instructions`` of a code object is computed
    once (a tuple, which ``_run_frame``'s ``tuple(...)`` returns as is)."""

    def __init__(self):
        super().__init__(dis)

    @staticmethod
    @functools.lru_cache(maxsize=8192)
    def _instructions(code) -> tuple:
        return tuple(dis.get_instructions(code))

    def get_instructions(self, x, *args, **kwargs):
        if isinstance(x, types.CodeType) and not args and not kwargs:
            return self._instructions(x)
        return dis.get_instructions(x, *args, **kwargs)


class _FramesOnDemand:
    """What ``inspect.stack()`` returns, called from the frame given: a list of
    ``FrameInfo``, outermost last; each is built when it is first indexed, so a frame's line
    is the one it runs then (the interpreter indexes it at once)."""

    def __init__(self, frame, context: int):
        self._frames, self._context, self._infos = [], context, {}
        while frame is not None:
            self._frames.append(frame)
            frame = frame.f_back

    def _info(self, i: int):
        if i not in self._infos:
            frame = self._frames[i]
            where = inspect.getframeinfo(frame, self._context)
            positions = {"positions": where.positions} if hasattr(where, "positions") else {}  # Python 3.11+
            self._infos[i] = inspect.FrameInfo(frame, *where, **positions)
        return self._infos[i]

    def __len__(self) -> int:
        return len(self._frames)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._info(j) for j in range(len(self._frames))[i]]
        return self._info(range(len(self._frames))[i])

    def __iter__(self):
        return (self._info(i) for i in range(len(self._frames)))


class _InspectWithStackOnDemand(_ModuleFor):
    """``inspect`` for thunder's interpreter: ``stack()`` as ``_FramesOnDemand``."""

    def __init__(self):
        super().__init__(inspect)

    @staticmethod
    def stack(context: int = 1):
        return _FramesOnDemand(sys._getframe(1), context)


def _fast_globals_lookup(interpreter):
    original = interpreter.globals_lookup
    unwrap, wrap_const = interpreter.unwrap, interpreter.wrap_const

    def globals_lookup(globals_dict, name):
        """thunder's ``globals_lookup``, where the name is one of Python's builtins: its
        value as a constant. Only where the module's ``__builtins__`` is Python's own (the
        builtins module or its dict, as for every imported module and ``__main__``), whose
        values are functions, types and constants; a module given other builtins (``exec``
        with a dict of its own) takes thunder's path."""
        g, n = unwrap(globals_dict), unwrap(name)
        if type(n) is str and type(g) is dict and n not in g:
            table = g.get("__builtins__")
            value = _BUILTINS.get(n, _MISSING)
            if (table is builtins or table is _BUILTINS) and value is not _MISSING:
                return wrap_const(value)
        return original(globals_dict, name)

    globals_lookup.thunder_fuser_original = original
    return globals_lookup


def _prompt_frame_maker(original):
    def get_or_make_python_frame(self):
        """thunder's frame maker, its wait for the helper thread handing over at once."""
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            return original(self)
        finally:
            sys.setswitchinterval(interval)

    get_or_make_python_frame.thunder_fuser_original = original
    return get_or_make_python_frame


def speed_up_thunders_interpreter() -> bool:
    """Install all four on thunder's interpreter; False where this thunder is not the one
    they were read from, or they are switched off (nothing is changed then)."""
    if thunder_0_2_6("THUNDER_FUSER_FAST_INTERPRETER") is None:
        return False
    import thunder.core.interpreter as interpreter

    lookup = interpreter.globals_lookup
    if hasattr(lookup, "thunder_fuser_original"):
        return True
    if lookup.__code__.co_argcount != 2 or "__builtins__" not in lookup.__code__.co_consts:
        return False
    frame_maker = getattr(interpreter.InterpreterFrame, "get_or_make_python_frame", None)
    if interpreter.dis is not dis or interpreter.inspect is not inspect:
        return False
    if frame_maker is None or "start_new_thread" not in frame_maker.__code__.co_names:
        return False
    interpreter.globals_lookup = _fast_globals_lookup(interpreter)
    interpreter.dis = _DisWithCachedInstructions()
    interpreter.inspect = _InspectWithStackOnDemand()
    interpreter.InterpreterFrame.get_or_make_python_frame = _prompt_frame_maker(frame_maker)
    return True
