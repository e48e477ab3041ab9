"""thunder's interpreter with ``patches/interpreter_speedups.py`` installed traces what it traced:
builtins resolve as CPython resolves them, a module's own names (tensors and numbers
included) keep thunder's provenance and its prologue checks, and exceptions inside
interpreted code still reach the program."""

import inspect
import sys
import types

import torch

import thunder_fuser  # noqa: F401  (installs the speed-ups, before thunder)
import thunder
import thunder.core.interpreter as interpreter
from thunder_fuser.patches import interpreter_speedups

SCALE = 2.0
BIAS = torch.full((4,), 0.5)


def _uses_builtins_and_globals(x, items):
    class NoAttr:
        pass

    n = len(items) + int(hasattr(NoAttr(), "missing")) + int(isinstance(x, torch.Tensor))
    try:
        next(iter(()))
    except StopIteration:  # raised inside interpreted code, caught there
        n += 1
    return x * SCALE + BIAS + n + max(items) + sum(abs(i) for i in items)


def test_installed_on_thunder_0_2_6():
    assert hasattr(interpreter.globals_lookup, "thunder_fuser_original")
    assert isinstance(interpreter.dis, interpreter_speedups._DisWithCachedInstructions)
    assert hasattr(interpreter.InterpreterFrame.get_or_make_python_frame, "thunder_fuser_original")
    assert isinstance(interpreter.inspect, interpreter_speedups._InspectWithStackOnDemand)
    assert interpreter_speedups.speed_up_thunders_interpreter()  # a second call changes nothing
    assert not hasattr(interpreter.globals_lookup.thunder_fuser_original, "thunder_fuser_original")


def test_builtins_and_module_globals_trace_as_eager():
    global SCALE
    x, items = torch.randn(4), [3, -1, 2]
    jf = thunder.jit(_uses_builtins_and_globals)
    torch.testing.assert_close(jf(x, items), _uses_builtins_and_globals(x, items))
    # a module's number is an input thunder checks: a new value is seen, not baked in
    old = SCALE
    try:
        SCALE = 3.0
        torch.testing.assert_close(jf(x, items), _uses_builtins_and_globals(x, items))
    finally:
        SCALE = old
    interval = sys.getswitchinterval()
    jf(x, [5])  # a new list length: traced again, its frames made again
    assert sys.getswitchinterval() == interval


def test_a_module_name_shadows_the_builtin_and_custom_builtins_are_read():
    src = "def f(x):\n    return x + len(x) + abs(x).sum()\n"
    shadowing = {"__name__": "shadowing", "len": lambda t: 100}
    exec(src, shadowing)
    x = torch.randn(3)
    torch.testing.assert_close(thunder.jit(shadowing["f"])(x), x + 100 + x.abs().sum())

    own = dict(vars(__builtins__) if isinstance(__builtins__, types.ModuleType) else __builtins__)
    own["len"] = lambda t: 7
    custom = {"__name__": "custom_builtins", "__builtins__": own}
    exec(src, custom)
    torch.testing.assert_close(thunder.jit(custom["f"])(x), x + 7 + x.abs().sum())


def test_an_unknown_name_still_raises_name_error():
    glob = {"__name__": "unknown_name"}
    exec("def f(x):\n    return x + not_defined_anywhere\n", glob)
    try:
        thunder.jit(glob["f"])(torch.randn(2))
    except NameError as e:
        assert "not_defined_anywhere" in str(e)
    else:
        raise AssertionError("NameError expected")


def test_instructions_are_dis_s_and_computed_once():
    import dis

    code = _uses_builtins_and_globals.__code__
    got = interpreter.dis.get_instructions(code)
    assert got == tuple(dis.get_instructions(code))
    assert interpreter.dis.get_instructions(code) is got
    assert interpreter.dis.opmap is dis.opmap and interpreter.dis.Instruction is dis.Instruction


def _both_stacks(context):
    """Read at once, as the interpreter reads it (a frame's line is read when indexed)."""
    lazy, eager = interpreter.inspect.stack(context), inspect.stack(context)
    return (list(lazy), lazy[2], lazy[1:], lazy[-1], len(lazy)), eager


def test_the_stack_on_demand_is_inspects_frame_by_frame():
    """Iterated, indexed, sliced, from either end: the ``FrameInfo`` ``inspect.stack()`` builds
    for each frame (but the first's line and columns: the helper's next line)."""
    for context in (1, 3, 0):
        (every, second, tail, last, n), want = _both_stacks(context)
        assert n == len(every) == len(want) > 3
        assert every[1:] == want[1:] == tail and second == want[2] and last == want[-1]
        assert every[0].frame is want[0].frame and every[0].function == want[0].function
    assert interpreter.inspect.signature is inspect.signature and interpreter.inspect.CO_GENERATOR == inspect.CO_GENERATOR
