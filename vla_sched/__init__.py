"""vla_sched: serve a vision-language-action model to many robots from one GPU under ROS 2.

The generated messages (``vla_sched.msg``) may be installed in another prefix than these
sources (a development venv, or a colcon install space next to an editable checkout).
``extend_path`` lets the one package name span every ``vla_sched`` folder on ``sys.path``,
so ``vla_sched.msg`` and ``vla_sched.core`` both import whichever way it was installed.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
