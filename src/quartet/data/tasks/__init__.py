"""Built-in tasks: seeded problem generators with exact verifiers, and their chat data sets."""

from quartet.data.tasks.arithmetic import ArithmeticProblem, ArithmeticSpec, verify_answer

__all__ = ["ArithmeticProblem", "ArithmeticSpec", "verify_answer"]
