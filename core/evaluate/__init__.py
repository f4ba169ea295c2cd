"""Evaluate: a verdict on a candidate for a site problem, made where the candidate cannot reach.

Static rules, isolated worker processes, the judge (correctness, guards, timing), the compiler's
report, hardware counters and the diagnosis drawn from them.

    verdict = evaluate(problem_path, candidate_source, EvalConfig())
    with Evaluator(EvalConfig(), workers=4) as ev:
        verdicts = ev.evaluate_many([(problem_path, source), ...])
"""

from core.evaluate.config import EvalConfig
from core.evaluate.evaluator import Evaluator, evaluate
from core.evaluate.verdict import Verdict

__all__ = ["EvalConfig", "Evaluator", "Verdict", "evaluate"]
