"""Live training progress: a rich display on a terminal, one line per iteration otherwise.

Both displays show the reward, timesteps, throughput, learner queue, elapsed time and an
ETA toward the stop criteria. The plain form is ``logfmt`` (``key=value`` pairs after the
word ``result``), readable by people and by scripts such as ``benchmarks/end_to_end.py``::

    result iter=3 timesteps_total=1024 reward_mean=12.50 reward_min=9.0 reward_max=26.0 ...
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Protocol, TextIO

from actorrl.algorithms.stop import StopCriteria


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _fmt_number(value: Any, digits: int = 2) -> str:
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def plain_line(result: dict[str, Any], derived: dict[str, float], elapsed_s: float,
               eta_s: float | None) -> str:
    """The ``logfmt`` line of one iteration."""
    fields = {
        "iter": result.get("training_iteration"),
        "timesteps_total": result.get("timesteps_total"),
        "reward_mean": _fmt_number(result.get("episode_reward_mean")),
        "reward_min": _fmt_number(result.get("episode_reward_min"), 1),
        "reward_max": _fmt_number(result.get("episode_reward_max"), 1),
        "episode_len_mean": _fmt_number(result.get("episode_len_mean"), 1),
        "episodes_this_iter": result.get("episodes_this_iter"),
        "num_steps_trained": result.get("num_steps_trained"),
        "env_steps_per_s": _fmt_number(derived.get("env_steps_per_s", math.nan), 0),
        "trained_steps_per_s": _fmt_number(derived.get("trained_steps_per_s", math.nan), 0),
        "learner_queue": _fmt_number(derived.get("learner_queue_size", math.nan), 1),
        "workers": result.get("num_healthy_workers"),
        "elapsed_s": f"{elapsed_s:.1f}",
        "eta_s": "-" if eta_s is None else f"{eta_s:.0f}",
    }
    evaluation = result.get("evaluation")
    if isinstance(evaluation, dict):
        fields["eval_reward_mean"] = _fmt_number(evaluation.get("episode_reward_mean"))
    fields.update({f"policy/{pid}": _fmt_number(value)  # multi-agent: each policy's return
                   for pid, value in sorted((result.get("policy_reward_mean") or {}).items())})
    fields.update({f"custom/{name}": _fmt_number(value)
                   for name, value in custom_means(result).items()})
    return "result " + " ".join(f"{k}={v}" for k, v in fields.items())


def custom_means(result: dict[str, Any]) -> dict[str, float]:
    """The ``<name>_mean`` entries of the result's ``custom_metrics`` (the live view shows
    those; the files hold min and max too)."""
    custom = result.get("custom_metrics") or {}
    return {k: v for k, v in custom.items() if k.endswith("_mean")}


class ProgressDisplay(Protocol):
    """What the training loop reports to."""

    def start(self, title: str, criteria: StopCriteria) -> None:
        """Training begins (after the actors are up)."""

    def update(self, result: dict[str, Any], derived: dict[str, float],
               best_reward: float | None) -> None:
        """One iteration finished."""

    def note(self, text: str) -> None:
        """A one-line event (checkpoint written, stop requested...)."""

    def close(self) -> None:
        """Training is over; leave the terminal clean."""


class PlainProgress:
    """One ``logfmt`` line per iteration on ``stream`` (stdout when it is not a TTY)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.criteria = StopCriteria()
        self.started = time.monotonic()

    def start(self, title: str, criteria: StopCriteria) -> None:
        """Print the title and the stop criteria."""
        self.criteria = criteria
        self.started = time.monotonic()
        self.note(f"training {title}; stop at: {criteria.describe()}")

    def update(self, result: dict[str, Any], derived: dict[str, float],
               best_reward: float | None) -> None:
        """Print the iteration's line."""
        elapsed = time.monotonic() - self.started
        eta = self.criteria.eta_s(result, elapsed, derived.get("env_steps_per_s", 0.0))
        print(plain_line(result, derived, elapsed, eta), file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """Print ``text`` as its own line."""
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Nothing to clean up."""


class RichProgress:
    """A live panel (stats table plus a bar toward the nearest stop criterion with elapsed
    time and ETA), refreshed four times a second while training runs."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console()
        self.criteria = StopCriteria()
        self.started = time.monotonic()
        self.title = ""
        self.result: dict[str, Any] | None = None
        self.derived: dict[str, float] = {}
        self.best_reward: float | None = None
        self._live: Any = None

    def start(self, title: str, criteria: StopCriteria) -> None:
        """Start the live panel."""
        from rich.live import Live

        self.title, self.criteria = title, criteria
        self.started = time.monotonic()
        self._live = Live(self, console=self.console, refresh_per_second=4, transient=False,
                          redirect_stdout=True, redirect_stderr=True)
        self._live.start()

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        elapsed = time.monotonic() - self.started
        result, derived = self.result, self.derived
        steps_per_s = derived.get("env_steps_per_s", 0.0)
        eta = self.criteria.eta_s(result, elapsed, steps_per_s)
        table = Table.grid(padding=(0, 2))
        for _ in range(4):
            table.add_column()
        if result is None:
            table.add_row("starting", "", "", "")
        else:
            best = "-" if self.best_reward is None else f"{self.best_reward:.1f}"
            target = "" if self.criteria.reward is None else f" / {self.criteria.reward:g}"
            table.add_row(
                "[bold]reward[/]", f"{_fmt_number(result.get('episode_reward_mean'), 1)} "
                f"(best {best}{target})",
                "[bold]iteration[/]", str(result.get("training_iteration")))
            table.add_row(
                "[bold]timesteps[/]", f"{int(result.get('timesteps_total', 0)):,}"
                + ("" if self.criteria.timesteps is None
                   else f" / {self.criteria.timesteps:,}"),
                "[bold]env steps/s[/]", f"{steps_per_s:,.0f}")
            queue = derived.get("learner_queue_size")
            table.add_row(
                "[bold]trained[/]", f"{int(result.get('num_steps_trained', 0)):,}",
                "[bold]learner queue[/]", "-" if queue is None else f"{queue:.1f}")
            evaluation = result.get("evaluation")
            if isinstance(evaluation, dict):
                table.add_row(
                    "[bold]evaluation[/]",
                    f"{_fmt_number(evaluation.get('episode_reward_mean'), 1)} "
                    f"({evaluation.get('episodes_this_iter', 0)} episodes)", "", "")
            for pid, value in sorted((result.get("policy_reward_mean") or {}).items()):
                table.add_row(f"[bold]policy {pid}[/]", _fmt_number(value), "", "")
            for name, value in custom_means(result).items():
                table.add_row(f"[bold]{name}[/]", _fmt_number(value), "", "")
        fraction = self.criteria.fraction(result, elapsed)
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=1.0, completed=fraction, width=40),
                    Text(f"{fraction * 100:3.0f}%  elapsed {_fmt_duration(elapsed)}  "
                         f"ETA {_fmt_duration(eta)}"))
        return Group(Text(self.title, style="bold cyan"), table, bar)

    def update(self, result: dict[str, Any], derived: dict[str, float],
               best_reward: float | None) -> None:
        """Show the latest iteration."""
        self.result, self.derived, self.best_reward = result, derived, best_reward
        if self._live is not None:
            self._live.refresh()

    def note(self, text: str) -> None:
        """Print ``text`` above the live panel."""
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def close(self) -> None:
        """Stop refreshing; the last panel stays on screen."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def make_progress(mode: str = "auto") -> ProgressDisplay:
    """``rich`` on a terminal, ``plain`` otherwise (``mode`` forces one)."""
    if mode == "rich" or (mode == "auto" and sys.stdout.isatty()):
        return RichProgress()
    return PlainProgress()
