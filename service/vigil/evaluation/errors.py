from vigil.errors import VigilError


class EvaluationError(VigilError):
    """Input the rule evaluation or the gate cannot use: an unreadable file, an unknown format, no outcomes."""
