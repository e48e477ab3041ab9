"""The one error of kernel generation that is no bug: a segment no template covers.

Lowering (``expr.py``), creation ops (``constants.py``), geometry and the families raise it
with the reason a user reads in ``explain``; the segment then runs on the reference backend
with one ``KernelFallbackWarning``. Any other exception is a bug of ours
(``KernelBugWarning``). Its own module, so that every stage can raise it without
importing another.
"""


class Unsupported(Exception):
    """The segment cannot be generated: the message is the reason a user reads."""
