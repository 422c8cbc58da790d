"""Personal data and secrets in text: the one detector behind the ``pii_leak`` rule and export redaction.

Keys and tokens come from ``detect-secrets``' maintained plugins (AWS, GitHub, Slack, JWT, Stripe,
private keys and two dozen more): their patterns are read from the plugins and run on RE2, and a
plugin's own validity check (a JWT's header must decode) is kept. Vigil's own recognizers cover what
they miss (``sk-proj-``/``sk-ant-`` keys, an AWS secret key, a password or token after its keyword) and
personal data, each with the checks that keep ids apart from it: Luhn for cards, ISO 7064 mod-97 for
IBANs, the SSA's rules for SSNs (no area 000, 666 or 9xx, no group 00, no serial 0000), octets up to
255 for IPv4, a keyword before a bare phone number or a date of birth.

Every pattern runs on RE2 (linear in the text, whatever it holds) and the checks after a match cost a
bounded amount per match, so a hostile message of ``VIGIL_MAX_MESSAGE_BYTES`` costs linear time.
RE2 has no lookarounds: boundaries are checked by hand on the characters around a match.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import pkgutil
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from vigil.rules.fold import Folded, fold
from vigil.rules.patterns import compile_linear

Kind = Literal["email", "phone", "card", "ssn", "iban", "ip", "dob", "address", "secret"]
KINDS: tuple[Kind, ...] = ("email", "phone", "card", "ssn", "iban", "ip", "dob", "address", "secret")


@dataclass(frozen=True, slots=True)
class Found:
    """One detected value: its kind and its character span in the text; ``decoded``: the value itself when
    the span is an encoded run it was found in (base64), else None (the value is the span's text)."""

    kind: Kind
    start: int
    end: int
    decoded: str | None = None


def _rx(pattern: str, ignore_case: bool = False) -> Any:
    return compile_linear(pattern, ignore_case)


def _word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _before(text: str, start: int) -> str:
    return text[start - 1] if start > 0 else ""


def _after(text: str, end: int) -> str:
    return text[end] if end < len(text) else ""


_NON_DIGIT = re.compile(r"\D")  # on a matched value only (bounded length)


def digits_of(value: str) -> str:
    return _NON_DIGIT.sub("", value)


# --- emails -------------------------------------------------------------------------------------

_LOCAL = r"[\p{L}\p{N}._%+\-']+"
_LABEL = r"[\p{L}\p{N}](?:[\p{L}\p{N}\-]*[\p{L}\p{N}])?"
# Plain and IDN addresses (josé@exämple.de), and URL-encoded ones (jane%40example.com, %2540 double-encoded).
_EMAIL = _rx(rf"{_LOCAL}(?:@|＠|%40|%2540){_LABEL}(?:\.{_LABEL})*\.\p{{L}}{{2,}}")
# Obfuscated: "jane.doe [at] example [dot] com", "jane(at)example.com", "jane dot doe at example dot com".
# Spaces around "at" and "dot" are bounded: a matched value stays short whatever the text holds.
_AT = r"(?:\s{0,3}(?:\[at\]|\(at\)|\{at\}|<at>|\[@\]|\(@\))\s{0,3}|\s{1,3}(?:at|AT)\s{1,3})"
_DOT = r"(?:\s{0,3}(?:\[dot\]|\(dot\)|\{dot\}|<dot>|\[\.\])\s{0,3}|\s{1,3}(?:dot|DOT)\s{1,3})"
_BRACKETED_AT = ("[at]", "(at)", "{at}", "<at>", "[@]", "(@)")
_OBFUSCATED = _rx(
    rf"[A-Za-z0-9_%+\-]+(?:(?:\.|{_DOT})[A-Za-z0-9_%+\-]+)*{_AT}"
    rf"[A-Za-z0-9\-]+(?:(?:\.|{_DOT})[A-Za-z0-9\-]+)*(?:\.|{_DOT})[A-Za-z]{{2,6}}\b"
)


def _emails(text: str, low: str) -> Iterator[tuple[int, int]]:
    if "@" in text or "＠" in text or "%40" in text or "%2540" in text:
        for m in _EMAIL.finditer(text):
            start, end = m.span()
            while start < end and text[start] in "._%+-'":
                start += 1
            if text[start:end].startswith(("40", "2540")) and _before(text, start) == "%":
                continue
            yield start, end
    if "at" in low and ("dot" in low or "[" in low or "(" in low or "{" in low or "<" in low) and _spelled(text, low):
        for m in _OBFUSCATED.finditer(text):
            value = m.group(0)
            low_value = " ".join(value.lower().split())
            plain_at = not any(at in low_value for at in _BRACKETED_AT)
            if plain_at and " dot " not in low_value:
                continue  # "meet at home.com" is prose; a spelled-out "at" needs a spelled-out "dot"
            yield m.span()


def _spelled(text: str, low: str) -> bool:
    """Whether ``text`` holds what an obfuscated address needs to count: a bracketed "at" or a spelled-out
    "dot" (in any case: "jane [.] Dot at example.com" reads as one)."""
    return any(at in text for at in _BRACKETED_AT) or "dot" in (low if low is not text else text.lower())


# --- numbers ------------------------------------------------------------------------------------

# A run of digit groups joined by single separators: "4242.4242.4242.4242", "123-45-6789", "10.0.0.1".
# Python's engine runs it: it cannot backtrack (a repetition must open with a separator, which a digit
# never is, and nothing follows the repetition that could fail), and it is the one pattern here matched
# once per number of a text full of numbers, where RE2's per-match cost in Python would dominate.
_DIGIT_GROUPS = re.compile(r"[0-9]+(?:[ .\-][0-9]+)*")
_GROUP = re.compile(r"\d+")  # on one run at a time


def _runs(text: str) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
    """Digit runs with their groups' spans; runs glued to letters or more digits are skipped."""
    for m in _DIGIT_GROUPS.finditer(text):
        start, end = m.span()
        if end - start < 7:
            continue  # shorter than any card, SSN or IPv4 address ("1.1.1.1")
        prev = _before(text, start)
        if prev.isalpha() or prev == "_":
            continue
        groups = [(start + g.start(), start + g.end()) for g in _GROUP.finditer(m.group(0))]
        yield start, end, groups


def luhn_ok(digits: str) -> bool:
    total, parity = 0, len(digits) % 2
    for pos, ch in enumerate(digits):
        d = ord(ch) - 48
        if pos % 2 == parity:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# How card numbers are written in groups (Visa, Mastercard, Discover: 4-4-4-4 with up to 3 more digits;
# Amex 4-6-5, Diners 4-6-4); a single run of 13 to 19 digits is tried as it is.
_CARD_SHAPES = ((4, 4, 4, 4, 3), (4, 4, 4, 4, 2), (4, 4, 4, 4, 1), (4, 4, 4, 4), (4, 6, 5), (4, 6, 4))


def _cards(text: str, runs: list[tuple[int, int, list[tuple[int, int]]]]) -> Iterator[tuple[int, int]]:
    """Card numbers, Luhn-checked, in whole groups of one run with one separator throughout."""
    for _start, _end, groups in runs:
        sizes = [b - a for a, b in groups]
        i = 0
        while i < len(groups):
            size = sizes[i]
            found = None
            if 13 <= size <= 19:
                glued = (i > 0 and text[groups[i - 1][1]] in ".-") or (
                    i + 1 < len(groups) and text[groups[i][1]] in ".-"
                )  # 13.750000000000028: float noise, not a card; 2024-0000000000000: an id
                if (
                    not glued
                    and luhn_ok(text[groups[i][0] : groups[i][1]])
                    and not _repetitive(text[groups[i][0] : groups[i][1]])
                ):
                    found = i
            elif size == 4:
                for shape in _CARD_SHAPES:
                    j = i + len(shape) - 1
                    if j >= len(groups) or tuple(sizes[i : j + 1]) != shape:
                        continue
                    if len({text[groups[k][1]] for k in range(i, j)}) != 1:
                        continue
                    value = "".join(text[a:b] for a, b in groups[i : j + 1])
                    if luhn_ok(value) and not _repetitive(value):
                        found = j
                        break
            if found is not None:
                yield groups[i][0], groups[found][1]
                i = found + 1
            else:
                i += 1


def _repetitive(digits: str) -> bool:
    return len(set(digits)) == 1  # 0000000000000, 1111111111111111: fillers, not cards


def ssn_ok(area: str, group: str, serial: str) -> bool:
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


_SSN_CONTEXT = _rx(r"(?i)\b(?:ssn|ss#|social security(?: number| no\.?)?|social)\b[^\d\n]{0,20}(\d{9})\b")


def _ssns(text: str, low: str, runs: list[tuple[int, int, list[tuple[int, int]]]]) -> Iterator[tuple[int, int]]:
    for _start, _end, groups in runs:
        for i in range(len(groups) - 2):
            a, g, s = (text[x:y] for x, y in groups[i : i + 3])
            if (len(a), len(g), len(s)) != (3, 2, 4):
                continue
            if text[groups[i][1]] != text[groups[i + 1][1]]:
                continue  # 123-45 6789: mixed separators
            sep = text[groups[i][1]]
            if (i + 3 < len(groups) and text[groups[i + 2][1]] == sep) or (i > 0 and text[groups[i - 1][1]] == sep):
                continue  # part of a longer run of the same separator (a phone, a date, an id)
            if ssn_ok(a, g, s):
                yield groups[i][0], groups[i + 2][1]
    if "ss" in low or "social" in low:
        for m in _SSN_CONTEXT.finditer(text):
            value = m.group(1)
            if not _after(text, m.end(1)).isdigit() and ssn_ok(value[:3], value[3:5], value[5:]):
                yield m.span(1)


def _ips(text: str, runs: list[tuple[int, int, list[tuple[int, int]]]]) -> Iterator[tuple[int, int]]:
    for quad in _dotted_quads(text, runs):
        start, end = quad[0][0], quad[-1][1]
        if any(b - a > 3 or int(text[a:b]) > 255 for a, b in quad):
            continue
        words = text[max(0, start - 9) : start].lower().split()
        if (words and words[-1].rstrip(".:") in ("v", "ver", "version")) or text[max(0, start - 1) : start] in (
            "v",
            "V",
        ):
            continue  # a software version, not an address
        yield start, end
    if "::" in text or text.count(":") >= 7:
        for m in _IPV6.finditer(text):
            start, end = m.span()
            if _word(_before(text, start)) or _word(_after(text, end)) or _before(text, start) == ":":
                continue
            value = m.group(0)
            full = value.count(":") == 7
            if full or ("::" in value and any(c.isalpha() for c in value)):
                yield start, end


def _dotted_quads(text: str, runs: list[tuple[int, int, list[tuple[int, int]]]]) -> Iterator[list[tuple[int, int]]]:
    """Four groups joined by dots, with no dot-joined group on either side."""
    for _start, _end, groups in runs:
        chain: list[tuple[int, int]] = []
        for k, g in enumerate(groups):
            chain.append(g)
            if k + 1 == len(groups) or text[g[1]] != ".":
                if len(chain) == 4:
                    yield chain
                chain = []


_IPV6 = _rx(r"[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}")


# --- phones ---------------------------------------------------------------------------------------

# A phone number needs a separator, parentheses or a leading "+", or a phone word before it: bare
# digit runs are order, item and tracking numbers far more often than phone numbers. International
# numbers ("intl": "+", country code, then groups) hold 8 to 15 digits as E.164 allows and do not
# look like a signed amount with thousands groups (+10 000 000).
_PHONE = _rx(
    r"\+\d{1,3}[ .\-]?\d{3}[ .\-]?\d{3}[ .\-]?\d{4}"
    r"|(?:\+?\d{1,3}[ .\-])?(?:\(\d{3}\)[ .\-]?|\d{3}[ .\-])\d{3}[ .\-]\d{4}"
    r"|(?P<intl>\+[1-9]\d{0,2}(?:[ .\-]?(?:\(\d{1,4}\)|\d{1,4})){2,6})"
)
_THOUSANDS = re.compile(r"\+\d{1,3}(?:[ .]\d{3})+")  # on a matched value only
# "call me at 4155550123", "phone: 555 0123", "mobile 5550123", and the keys of tool results and
# records: "phones", "phone_number", "phoneNumber", "home_phone", "cellphone", "mobile_no".
_PHONE_CONTEXT = _rx(
    r"(?i)(?:\b|_)(?:cell|home|work|mobile)?"
    r"(?:phone|telephone|tel|mobile|cell|call|text|reach|fax|whatsapp|sms|dial|ring)(?:s|es)?"
    r"(?:[_\-]?(?:numbers?|nums?|nos?))?\b"
    r"[^\d\n+$€£]{0,24}(\+?\d[\d .\-]{5,16}\d)"
)
# More numbers of the same list after one found by its keyword: "phones": [4155550123, 4155550124],
# "call 4155550123 or 4155550124".
_PHONE_NEXT = _rx(r"(?i)[\"']?[ \t]*(?:[,;/]|\bor\b|\band\b)[ \t]*[\"']?(\+?\d[\d .\-]{5,16}\d)")
_PHONE_WORDS = ("phone", "tel", "mobile", "cell", "call", "text", "reach", "fax", "whatsapp", "sms", "dial", "ring")
_NOT_A_PHONE = ("order", "invoice", "ticket", "tracking", "account", "case", "ref", "id ", "_id", "#", "number of")
_SEVEN = _rx(r"\d{3}[.\-]\d{4}")
_MAX_LISTED = 50  # numbers read after one keyword


def _phones(text: str, low: str) -> Iterator[tuple[int, int]]:
    for m in _PHONE.finditer(text):
        start, end = m.span()
        prev, nxt = _before(text, start), _after(text, end)
        if _word(prev) or (prev and prev in "+-") or _word(nxt) or nxt == "-":
            continue
        if m.group("intl"):
            value = m.group(0)
            if not 8 <= len(digits_of(value)) <= 15 or _THOUSANDS.fullmatch(value):
                continue
        yield start, end
    for m in _SEVEN.finditer(text):
        start, end = m.span()
        prev, nxt = _before(text, start), _after(text, end)
        if _word(prev) or (prev and prev in "+-.:/$€£#") or _word(nxt) or nxt == "-":
            continue
        if nxt == "." and _after(text, end + 1).isdigit():
            continue
        yield start, end
    if any(w in low for w in _PHONE_WORDS):
        for m in _PHONE_CONTEXT.finditer(text):
            start, end = m.span(1)
            if _word(_after(text, end)):
                continue
            if any(w in low[m.start() : start] for w in _NOT_A_PHONE):
                continue  # "call us about order 5550123456": the number is the order's
            if len(digits_of(m.group(1))) not in (7, 10, 11):
                continue
            yield start, end
            for _ in range(_MAX_LISTED):
                more = _PHONE_NEXT.match(text, end)
                if more is None or _word(_after(text, more.end(1))):
                    break
                start, end = more.span(1)
                if len(digits_of(more.group(1))) not in (7, 10, 11):
                    break
                yield start, end


# --- dates of birth, street addresses, IBANs ----------------------------------------------------

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DATE = (
    rf"\d{{1,2}}[/.\-]\d{{1,2}}[/.\-]\d{{2,4}}|\d{{4}}[/.\-]\d{{1,2}}[/.\-]\d{{1,2}}"
    rf"|{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH},? \d{{4}}"
)
_DOB_WORDS = ("birth", "born", "dob", "d.o.b")
_DOB = _rx(
    rf"(?i)\b(?:born|birth|dob|d\.o\.b\.?|birthday|birthdate|date of birth)\b[^\d\n]{{0,24}}?({_DATE})",
)

_STREET_TYPE = (
    r"(?i:street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|way|place|pl|terrace|"
    r"circle|cir|parkway|pkwy|highway|hwy|square|sq|trail|trl|crescent|close|row)"
)
_ADDRESS = _rx(
    r"\b\d{1,6}[A-Za-z]?,? (?:(?:[NSEW]\.?|North|South|East|West) )?"
    r"(?:(?:[A-Z][a-z'\-]+|\d{1,3}(?:st|nd|rd|th)) ){1,4}" + _STREET_TYPE + r"\b\.?"
    r"(?:,? (?:Apt|Apartment|Suite|Ste|Unit|Fl|Floor|#)\.? ?#?[A-Za-z0-9\-]+)?"
    r"(?:, [A-Z][a-z]+(?: [A-Z][a-z]+){0,2})?(?:,? [A-Z]{2})?(?: \d{5}(?:-\d{4})?)?"
)

_IBAN = _rx(r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,32}")
# Lengths by country (ISO 13616 registry); others are tried at every length from 15 to 34.
_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AT": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "CH": 21, "CY": 28, "CZ": 24,
    "DE": 22, "DK": 18, "EE": 20, "ES": 24, "FI": 18, "FR": 27, "GB": 22, "GR": 27, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IS": 26, "IT": 27, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MT": 31,
    "NL": 18, "NO": 15, "PL": 28, "PT": 25, "RO": 24, "SA": 24, "SE": 24, "SI": 19, "SK": 24, "TR": 26,
}  # fmt: skip


def iban_ok(iban: str) -> bool:
    """ISO 7064 mod 97-10: the country code and check digits moved to the end, letters as 10..35."""
    moved = iban[4:] + iban[:4]
    total = 0
    for ch in moved:
        total = (total * (100 if ch.isalpha() else 10) + (ord(ch) - 55 if ch.isalpha() else ord(ch) - 48)) % 97
    return total == 1


def _ibans(text: str) -> Iterator[tuple[int, int]]:
    for m in _IBAN.finditer(text):
        start = m.start()
        if _word(_before(text, start)):
            continue
        positions = [start + k for k, ch in enumerate(m.group(0)) if ch != " "]
        compact = "".join(text[p] for p in positions)
        country = compact[:2]
        lengths = [_IBAN_LENGTHS[country]] if country in _IBAN_LENGTHS else range(min(34, len(compact)), 14, -1)
        for n in lengths:
            if n <= len(compact) and not _word(_after(text, positions[n - 1] + 1)) and iban_ok(compact[:n]):
                yield start, positions[n - 1] + 1
                break


def _regex_spans(
    rx: Any, group: int = 0, needles: tuple[str, ...] = ()
) -> Callable[[str, str], Iterator[tuple[int, int]]]:
    def spans(text: str, low: str) -> Iterator[tuple[int, int]]:
        if needles and not any(n in low for n in needles):
            return
        for m in rx.finditer(text):
            yield m.span(group)

    return spans


_DOB_SPANS = _regex_spans(_DOB, 1, _DOB_WORDS)
_ADDRESS_SPANS = _regex_spans(_ADDRESS)


# --- secrets ----------------------------------------------------------------------------------------

_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.+/=")
_OWN_SECRETS = (
    # OpenAI (sk-proj-, sk-svcacct-, legacy sk-) and Anthropic (sk-ant-api03-) keys.
    _rx(r"sk-(?:proj-|ant-|svcacct-|admin-|live-|test-)?[A-Za-z0-9_\-]{20,}"),
    # Google API keys, Hugging Face tokens, GitHub fine-grained tokens, GitLab personal tokens.
    _rx(r"AIza[0-9A-Za-z_\-]{35}|hf_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}|glpat-[A-Za-z0-9_\-]{20}"),
)
# An AWS secret access key: 40 characters of base64 with upper and lower case letters and a digit.
_AWS_SECRET = _rx(r"[A-Za-z0-9/+]{40}")
# A value after its keyword: "password: hunter2!", "DB_PASSWORD=s3cr3t", "the admin password is 'x9$Lq'",
# "your temporary password is: hunter2!x". Not a value: a noun the keyword qualifies (_QUALIFIER), a
# lowercase word after a keyword written out, a capitalised word that opens a sentence (_opens_sentence).
_KEYWORD = _rx(
    r"(?i)(password|passwd|pwd|passphrase|passcode|secret|secret[_ \-]?key|api[_ \-]?key|access[_ \-]?key|"
    r"auth[_ \-]?token|access[_ \-]?token|token|client[_ \-]?secret|credentials?)[\"']?"
    r"(?:\s*(?:=|:=|=>|:)\s*|\s+(?:is|was|will be|=)\s+(?:set to\s+)?|\s+(?:is|was|will be)\s*:\s*|\s+)"
    r"([\"'`]?)([^\s\"'`<>,;]{4,200})"
)

# A noun right after the keyword that makes it another thing, labelled with ":" or "=" ("password strength:
# strong", "token balance: 1500", "API key rotation: enabled", "secret question: What ..."): the keyword
# qualifies the noun, and the value is the noun's. Stdlib ``re``, anchored and bounded: linear.
_QUALIFIER = re.compile(r"[A-Za-z][A-Za-z\-]{0,40}[ \t]*[:=][ \t]*([\"'`]?)([^\s\"'`<>,;]{0,200})")


def _shaped(value: str) -> bool:
    """Whether ``value`` has a secret's shape: letters and digits both, a character neither a letter, a digit
    nor a hyphen, or a capital after its first letter (``Tr0ub4dor&3``, ``x9$Lq``, ``ghp_...``); an ordinary
    word (``enabled``, ``What``) or a number (``1500``) has not."""
    letters = digits = False
    for i, c in enumerate(value):
        if c.isalpha():
            letters = True
            if i and c.isupper():
                return True
        elif c.isdigit():
            digits = True
        elif c != "-":
            return True
    return letters and digits


# Words that carry a sentence on after the word before them: after "password:", a capitalised word these follow
# is the password ("Sunshine and your username: bob", "Dolphins for the guest network").
_RUNS_ON = frozenset(("and", "or", "but", "to", "for", "until", "till", "then", "so", "on", "at", "in", "with", "from"))
# Capitalised words that open an instruction or a sentence whatever follows them ("Click on Forgot password",
# "Navigate to Settings", "Due to an update", "Required for all accounts"): verbs of an interface, openers and
# the words of a form's field that are not passwords.
_OPENERS = frozenset((
    "open", "click", "select", "choose", "press", "visit", "navigate", "head", "enter", "type", "follow", "sign",
    "scroll", "switch", "return", "reply", "start", "begin", "check", "contact", "call", "reset", "change",
    "update", "create", "make", "pick", "find", "look", "search", "wait", "refer", "move", "keep", "write",
    "remember", "note", "please", "thanks", "thank", "sorry", "simply", "just", "first", "next", "then", "also",
    "once", "after", "before", "here", "there", "this", "that", "these", "those", "below", "above", "due",
    "according", "prior", "unable", "same", "similar", "subject", "send", "share", "tell", "reach",
    "required", "optional", "needed", "hidden", "protected", "encrypted", "masked", "changed", "updated",
    "expired", "sent", "saved", "stored", "valid", "invalid", "incorrect", "enabled", "disabled", "unknown",
    "available", "unavailable", "welcome",
))  # fmt: skip
# Words that tell the state of a password or key where its value would be ("password: Required.", "Your password
# is Incorrect", "API key: Revoked", "token: expired", "Secret: None"), and a mask in its place ("********").
_STATES = frozenset((
    "required", "optional", "needed", "hidden", "protected", "encrypted", "masked", "redacted", "changed",
    "updated", "expired", "sent", "saved", "stored", "valid", "invalid", "correct", "incorrect", "wrong",
    "enabled", "disabled", "unknown", "available", "unavailable", "revoked", "reset", "none", "null", "empty",
    "missing", "pending", "active", "inactive", "locked", "unlocked", "verified", "accepted", "rejected",
    "unset", "blank",
))  # fmt: skip
_MASK = frozenset("*•●")


def _states(value: str) -> bool:
    """Whether a bare ``value`` after the keyword is a state word or a mask, not the password."""
    return value.lower() in _STATES or set(value) <= _MASK


_NEXT_WORD = re.compile(r"[ \t]+([^\W\d_]+)")  # anchored, on a bounded slice


def _opens_sentence(text: str, value: str, end: int) -> bool:
    """Whether a bare ``value`` ending at ``end`` is a capitalised word that opens a sentence or an instruction
    after the keyword (``password: Open Settings, then Security``, ``password: Click on Forgot password``): a
    word follows it, and that word is capitalised, or ``value`` is a word that opens instructions, or the word
    does not carry a sentence on (``password: This is...``). A password: ``password: Sunshine.``, and
    ``password: Sunshine and your username: bob``."""
    if not (value.isalpha() and value[0].isupper() and value[1:].islower()):
        return False
    nxt = _NEXT_WORD.match(text[end : end + 16])
    if nxt is None:
        return False
    word = nxt.group(1)
    return word[0].isupper() or value.lower() in _OPENERS or word not in _RUNS_ON


_KEYWORDS = ("pass", "pwd", "secret", "key", "token", "credential")

# The digits of a one-time code after what the code is for: "reset code: 483920", "Your verification code is
# 4839", "One-time PIN: 29384756", "OTP: 592011". Only these purposes: an error, order, zip, promo or
# confirmation code is no secret (a zip code is an address's, a confirmation code names a booking). 4 to 10
# digits, not part of a longer number, a decimal or a date ("security code: 12345678901", "1.5", "2024-05-15").
_CODE_WORDS = ("code", "pin", "otp")
_CODE = _rx(
    r"(?i)\b(?:(?:reset|verification|verify|one[ \-]?time|otp|security|2fa|mfa|login|sign[ \-]?in)[ \t\-]?"
    r"(?:code|pin)|otp)\b(?:[ \t]*[:=][ \t]*|[ \t]+is[ \t]*:?[ \t]*)(\d{4,10})"
)
# A word after the digits that makes them a time or a quantity ("code is 1030 am", "OTP is 1030 seconds old",
# "sign-in code is 2030 minutes away"): the number measures something, it is not the code.
_UNITS = frozenset((
    "am", "pm", "a.m", "p.m", "utc", "gmt", "ms", "sec", "secs", "second", "seconds", "min", "mins", "minute",
    "minutes", "hr", "hrs", "hour", "hours", "day", "days", "week", "weeks", "month", "months", "year", "years",
    "time", "times", "digit", "digits", "character", "characters", "char", "chars", "attempt", "attempts",
))  # fmt: skip
_UNIT_WORD = re.compile(r"[ \t]+([A-Za-z](?:[A-Za-z.]{0,11}[A-Za-z])?)")  # anchored, on a bounded slice


def _measures(text: str, end: int) -> bool:
    """Whether the number ending at ``end`` is followed by a unit (``1030 am``, ``2030 minutes``)."""
    m = _UNIT_WORD.match(text[end : end + 16])
    return m is not None and m.group(1).lower() in _UNITS


# The kinds a value of which can be one only by a keyword before it ("password: hunter2!", "call me at
# 4155550123", "born on 03/14/1985", "SSN 123456789"), with the words, lower case, one of which the text
# before the value then holds (:mod:`vigil.rules.pii_split` reads them across a message boundary).
KEYWORDS: dict[Kind, tuple[str, ...]] = {
    "secret": _KEYWORDS,
    "phone": _PHONE_WORDS,
    "dob": _DOB_WORDS,
    "ssn": ("ssn", "ss#", "social"),
}


@cache
def _plugin_patterns() -> tuple[Any, list[tuple[Any, Callable[[str], bool] | None]]]:
    """Every detect-secrets plugin's patterns that RE2 can run, with the plugin's validity check if it has one.

    A pattern that needs a lookaround (a few plugins' keyword forms) is left out: Vigil's own keyword
    recognizer covers those.
    """
    plugins = importlib.import_module("detect_secrets.plugins")
    found: list[tuple[Any, Callable[[str], bool] | None]] = []
    sources: list[str] = []
    for info in sorted(pkgutil.iter_modules(plugins.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"detect_secrets.plugins.{info.name}")
        for obj in vars(module).values():
            denylist = getattr(obj, "denylist", None)
            if not isinstance(obj, type) or obj.__module__ != module.__name__ or not isinstance(denylist, list | tuple):
                continue
            check = getattr(obj, "is_formally_valid", None)
            for rx in denylist:
                if rx.flags & re.VERBOSE and re.search(r"\s|#", rx.pattern):
                    continue
                ignore_case = bool(rx.flags & re.IGNORECASE)
                try:
                    found.append((_rx(rx.pattern, ignore_case), check))
                except ValueError:
                    continue
                sources.append(f"(?{'i' if ignore_case else ''}:{rx.pattern})" if ignore_case else f"(?:{rx.pattern})")
    # One pass that says whether any plugin can match at all: ordinary text costs one scan, not thirty.
    return _rx("|".join(sources)), found


def _secrets(text: str, low: str) -> Iterator[tuple[int, int]]:
    any_plugin, plugins = _plugin_patterns()
    if any_plugin.search(text) is not None:
        for rx, check in plugins:
            yield from _extended(text, rx, check)
    for rx in _OWN_SECRETS:
        yield from _extended(text, rx, None)
    for m in _AWS_SECRET.finditer(text):
        start, end = m.span()
        value = m.group(0)
        if (
            _after(text, end) not in _TOKEN_CHARS
            and _before(text, start) not in _TOKEN_CHARS
            and any(c.isupper() for c in value)
            and any(c.islower() for c in value)
            and any(c.isdigit() for c in value)
        ):
            yield start, end
    if any(w in low for w in _CODE_WORDS):
        for m in _CODE.finditer(text):
            nxt = _after(text, m.end(1))
            if not (
                _word(nxt) or (nxt in ".,-/:" and _after(text, m.end(1) + 1).isdigit()) or _measures(text, m.end(1))
            ):
                yield m.span(1)
    if not any(w in low for w in _KEYWORDS):
        return
    for m in _KEYWORD.finditer(text):
        quote = m.group(2)
        start, end = m.span(3)
        while end > start and text[end - 1] in ".,)":
            end -= 1  # the sentence's full stop, not the value's
        value = text[start:end]
        if not value:
            continue
        if _word(_before(text, m.start())) and _before(text, m.start()) != "_":
            continue
        joiner = text[m.end(1) : m.start(2)]
        spelled = not quote and "=" not in joiner and ":" not in joiner
        if spelled and (q := _QUALIFIER.match(text, start)) is not None:
            # "password strength: strong": the value is the noun's, a secret only if it has a secret's shape
            start, end = q.span(2)
            while end > start and text[end - 1] in ".,)":
                end -= 1
            if end > start and _shaped(text[start:end]):
                yield start, end
            continue
        if spelled and ((value.isalpha() and value.lower() == value) or not value[0].isalnum()):
            continue  # "the token is invalid", "password reset": prose, not a value
        if not quote and _states(value):
            continue  # "password: Required.", "Your API key: Revoked": its state, not its value
        if not quote and not spelled and _opens_sentence(text, value, end):
            # "password: Open Settings, then Security": an instruction, not a value. After a keyword written out
            # ("the Wi-Fi password is Sunshine for guests") a capitalised word mid-sentence is the value.
            continue
        yield start, end


def _extended(text: str, rx: Any, check: Callable[[str], bool] | None) -> Iterator[tuple[int, int]]:
    """Matches grown to the whole token they start (a lazy plugin pattern stops early); each character
    is walked at most once, so overlapping matches in one long token cost no more than the token."""
    reach = 0
    for m in rx.finditer(text):
        start, end = m.span()
        if start < reach:
            continue
        while start < end and text[start] not in _TOKEN_CHARS:
            start += 1  # a plugin pattern that opens with the separator before the token
        while end < len(text) and text[end] in _TOKEN_CHARS:
            end += 1
        reach = end
        while end > start and text[end - 1] in ".=":
            end -= 1
        if end > start and (check is None or check(text[start:end])):
            yield start, end


# --- the detector -----------------------------------------------------------------------------------

_NEEDS_DIGITS = frozenset({"card", "ssn", "ip", "phone", "dob", "address", "iban"})
# The fewest ASCII digits a value of these kinds holds: a phone number 7 (_SEVEN, a number after a phone
# word), a card number 13. Three replies in four have fewer, and are not searched for them.
_LEAST_DIGITS = (("phone", 7), ("card", 13))


# Long texts are scanned in windows of CHUNK characters (cut after a whitespace where one is near) that
# reach OVERLAP characters into the next, so a value across a cut is seen whole by the window it starts
# in. Each window fits the CPU's caches: a megabyte costs what its thirty-odd windows cost, no more.
CHUNK = 1 << 15
OVERLAP = 4096
_CUT_SEARCH = 256


def find(text: str, kinds: Sequence[str] = KINDS) -> Iterator[Found]:
    """Every detected value of ``kinds`` in ``text`` (spans may overlap across kinds)."""
    if len(text) <= CHUNK + OVERLAP:
        yield from _scan(text, kinds)
        return
    seen: set[Found] = set()
    start = 0
    while start < len(text):
        end = start + CHUNK
        if end + OVERLAP >= len(text):
            end = len(text)
        else:
            space = max(text.rfind(" ", end - _CUT_SEARCH, end), text.rfind("\n", end - _CUT_SEARCH, end))
            end = space + 1 if space > start else end
        window = text[start : min(len(text), end + OVERLAP)]
        for f in _scan(window, kinds):
            shifted = Found(f.kind, f.start + start, f.end + start)
            if shifted not in seen:
                seen.add(shifted)
                yield shifted
        seen = {f for f in seen if f.end > end}  # only spans reaching the next window can recur
        start = end


def _scan(text: str, kinds: Sequence[str]) -> Iterator[Found]:
    wanted = set(kinds)
    low = text.lower()
    if len(low) != len(text):
        low = text  # lowercasing changed the length (rare letters): needles are then looked up as written
    digits = sum(map(text.count, "0123456789")) if wanted & _NEEDS_DIGITS else 0
    has_digit = digits > 0
    wanted.difference_update(kind for kind, least in _LEAST_DIGITS if digits < least)
    runs = list(_runs(text)) if has_digit and wanted & {"card", "ssn", "ip"} else []
    sources: list[tuple[Kind, Callable[[], Iterator[tuple[int, int]]]]] = [
        ("email", lambda: _emails(text, low)),
        ("phone", lambda: _phones(text, low) if has_digit else iter(())),
        ("card", lambda: _cards(text, runs)),
        ("ssn", lambda: _ssns(text, low, runs)),
        ("iban", lambda: _ibans(text) if has_digit else iter(())),
        ("ip", lambda: _ips(text, runs)),
        ("dob", lambda: _DOB_SPANS(text, low) if has_digit else iter(())),
        ("address", lambda: _ADDRESS_SPANS(text, low) if has_digit else iter(())),
        ("secret", lambda: _secrets(text, low)),
    ]
    for kind, spans in sources:
        if kind in wanted:
            for start, end in spans():
                if end > start:
                    yield Found(kind, start, end)


_SPELLED = (
    ("%2540", "@"), ("%40", "@"), ("＠", "@"), ("[at]", "@"), ("(at)", "@"), ("{at}", "@"), ("<at>", "@"),
    ("[@]", "@"), ("(@)", "@"), ("[dot]", "."), ("(dot)", "."), ("{dot}", "."), ("<dot>", "."), ("[.]", "."),
    (" at ", "@"), (" dot ", "."),
)  # fmt: skip


def detect(text: str, kinds: Sequence[str] = KINDS) -> list[Found]:
    """Detected values in text order, without overlaps: where two overlap, the one starting first wins,
    and of two starting together the longer (a phone number's last seven digits are not a second one).

    The text is read folded (:mod:`vigil.rules.fold`): a value hidden by a zero-width space, written in
    full-width digits or separated by no-break spaces is found, and its span covers those characters."""
    return _first_of_overlaps(_everything(text, kinds)) if text.isascii() else detect_folded(Folded(text), kinds)


def detect_folded(folded: Folded, kinds: Sequence[str] = KINDS) -> list[Found]:
    """:func:`detect` on a text already folded; spans are in the text as written."""
    kept = _first_of_overlaps(_everything(folded.text, kinds))
    if not folded.changed:
        return kept
    return [Found(f.kind, folded.start(f.start), folded.end(f.end), f.decoded) for f in kept]


def _everything(text: str, kinds: Sequence[str]) -> Iterator[Found]:
    yield from encoded(text, kinds)  # first: of two equal spans, a run that decodes to an email is an email
    yield from find(text, kinds)


# A run of base64, standard or URL-safe, padded or not: a JWT's payload, a "Basic" credential, a data blob.
_BASE64 = _rx(r"[A-Za-z0-9+/_\-]{12,}={0,2}")
MIN_DECODED = 8  # bytes; the shortest value worth finding in a blob ("a@bc.de" is 7)
_BLANKS = str.maketrans("\n\r\t", "   ")


def _decoded(run: str) -> str | None:
    """``run`` decoded as base64, if it is base64 of at least ``MIN_DECODED`` bytes of printable UTF-8 text
    (random bytes rarely are: hashes, hex and identifiers decode to binary and are skipped)."""
    body = run.rstrip("=")
    if body.islower() or body.isupper() or body.isdigit():
        return None  # base64 of text mixes cases; words, identifiers and numbers do not
    urlsafe, standard = "-" in body or "_" in body, "+" in body or "/" in body
    if (urlsafe and standard) or len(body) % 4 == 1:
        return None
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_" if urlsafe else None, validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return text if len(raw) >= MIN_DECODED and text.translate(_BLANKS).isprintable() else None


def encoded(text: str, kinds: Sequence[str] = KINDS) -> Iterator[Found]:
    """Values of ``kinds`` inside base64 runs of ``text`` (one level: a value encoded twice is not looked
    for), each spanning its whole run. An agent asked to "encode it so nobody can read it" still discloses
    what anyone can decode. The decoded runs are scanned as one text (a scan per run would cost its set-up
    thousands of times in a text of many short runs), each run apart from the next by a NUL no value
    spans (decoded text is printable)."""
    runs: list[tuple[int, int]] = []
    plains: list[str] = []
    starts: list[int] = []
    at = 0
    for m in _BASE64.finditer(text):
        plain = _decoded(m.group(0))
        if plain is not None:
            runs.append(m.span())
            plains.append(plain)
            starts.append(at)
            at += len(plain) + len(_APART)
    if not plains:
        return
    joined = _APART.join(plains)
    for f in _first_of_overlaps(find(joined, kinds)):
        k = bisect_right(starts, f.start) - 1
        if f.end <= starts[k] + len(plains[k]):
            yield Found(f.kind, runs[k][0], runs[k][1], joined[f.start : f.end])


_APART = "\n\x00\n"


def _first_of_overlaps(found: Iterable[Found]) -> list[Found]:
    kept: list[Found] = []
    reach = 0
    for f in sorted(found, key=lambda f: (f.start, f.start - f.end)):
        if f.start >= reach:
            kept.append(f)
            reach = f.end
    return kept


def value_of(found: Found, text: str) -> str:
    """The value ``found`` stands for, in its :func:`normal` form (decoded when it was found encoded)."""
    return normal(found.kind, found.decoded if found.decoded is not None else text[found.start : found.end])


def normal(kind: str, value: str) -> str:
    """A value in a form that compares equal however it was written (case, separators, encoding, the
    characters :mod:`vigil.rules.fold` folds)."""
    value = fold(value)
    if kind == "email":
        low = " ".join(value.lower().split())
        for spelled, plain in _SPELLED:
            low = low.replace(spelled, plain)
        return "".join(low.split())
    if kind in ("phone", "card", "ssn"):
        return digits_of(value)
    if kind == "iban":
        return value.replace(" ", "").upper()
    return value
