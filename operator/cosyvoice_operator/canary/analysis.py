"""The automatic analysis of a canary, as a pure function: the state and both versions' figures over one
interval → the next weight, a promotion or an abort, with the reason (Flagger's canary analysis, on the
figures a TTS service is judged by: p95 latency and time to first audio relative to the stable version,
and the error rate).

>>> from cosyvoice_operator.spec import CanaryAnalysis
>>> rules = CanaryAnalysis(step_weights=[25, 50], min_requests=10)
>>> ok = Figures(requests=100, p95_ms=800, ttfa_ms=300, error_rate=0.0)
>>> decide(State(weight=10), ok, ok, rules).action, decide(State(weight=50), ok, ok, rules).action
('step', 'promote')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..spec import CanaryAnalysis

Action = Literal["hold", "step", "promote", "abort"]
# status.canary.phase for each action (a hold at the last weight without promotion is Holding)
PHASES: dict[Action, str] = {"hold": "Progressing", "step": "Progressing", "promote": "Promoted", "abort": "Aborted"}


@dataclass(frozen=True)
class Figures:
    """One version over one interval; None: the metrics source returned nothing for it."""
    requests: float | None = None  # requests answered in the interval
    p95_ms: float | None = None  # p95 latency of the successful ones
    ttfa_ms: float | None = None  # p95 time to first audio
    error_rate: float | None = None  # share answered with a 5xx
    rate: float | None = None  # requests per second (shown, not judged)


@dataclass(frozen=True)
class State:
    weight: int  # the canary's weight in effect
    failed_checks: int = 0  # failing intervals in a row


@dataclass(frozen=True)
class Verdict:
    action: Action
    weight: int
    failed_checks: int
    reason: str
    message: str

    @property
    def phase(self) -> str:
        return "Holding" if self.reason == "WaitingForPromotion" else PHASES[self.action]


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f} ms"


def failures(stable: Figures, canary: Figures, rules: CanaryAnalysis) -> list[str]:
    """The thresholds the canary broke in this interval, each with its numbers."""
    found: list[str] = []
    if canary.error_rate is not None and canary.error_rate > rules.max_error_rate:
        found.append(f"error rate {canary.error_rate:.2%} > {rules.max_error_rate:.2%}")
    for what, mine, theirs, most in (("p95 latency", canary.p95_ms, stable.p95_ms, rules.max_p95_latency_ratio),
                                     ("time to first audio", canary.ttfa_ms, stable.ttfa_ms,
                                      rules.max_time_to_first_audio_ratio)):
        if mine is not None and theirs is not None and theirs > 0 and mine / theirs > most:
            found.append(f"{what} {_ms(mine)} is {mine / theirs:.2f}× stable's {_ms(theirs)} (at most {most:g}×)")
    return found


def decide(state: State, stable: Figures, canary: Figures, rules: CanaryAnalysis) -> Verdict:
    """One interval's verdict. Too few requests (or none measured) hold the weight and leave the count of
    failing intervals as it was: an idle interval proves nothing either way."""
    for name, figures in (("stable", stable), ("canary", canary)):
        if figures.requests is None:
            return Verdict("hold", state.weight, state.failed_checks, "MetricsUnavailable",
                           f"no request figures for the {name} version; weight held at {state.weight}%")
        if figures.requests < rules.min_requests:
            return Verdict("hold", state.weight, state.failed_checks, "NotEnoughRequests",
                           f"the {name} version answered {figures.requests:.0f} requests in the interval, fewer "
                           f"than minRequests {rules.min_requests}; weight held at {state.weight}%")
    broken = failures(stable, canary, rules)
    if broken:
        failed = state.failed_checks + 1
        if failed >= rules.failure_threshold:
            return Verdict("abort", 0, failed, "Aborted",
                           f"canary aborted at {state.weight}% after {failed} failing interval"
                           f"{'s' if failed > 1 else ''}: {'; '.join(broken)}; all traffic is back on stable")
        return Verdict("hold", state.weight, failed, "CheckFailed",
                       f"{'; '.join(broken)} ({failed}/{rules.failure_threshold} failing intervals before an abort)")
    summary = (f"p95 {_ms(canary.p95_ms)} vs {_ms(stable.p95_ms)}, time to first audio {_ms(canary.ttfa_ms)} vs "
               f"{_ms(stable.ttfa_ms)}, errors {(canary.error_rate or 0):.2%}")
    following = [w for w in rules.step_weights if w > state.weight]
    if following:
        return Verdict("step", following[0], 0, "StepWeight",
                       f"interval passed at {state.weight}% ({summary}); weight now {following[0]}%")
    if rules.promote:
        return Verdict("promote", state.weight, 0, "Promoted",
                       f"the last step passed at {state.weight}% ({summary}); the canary is promoted")
    return Verdict("hold", state.weight, 0, "WaitingForPromotion",
                   f"the last step passed at {state.weight}% ({summary}); promote by copying spec.canary's fields "
                   "into the spec and removing spec.canary")
