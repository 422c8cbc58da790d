"""Personal names a conversation states as data, and where they occur in text.

No pattern tells a name from any other capitalised word without a language model, but an agent's
conversation usually states its user's name as data: a profile's ``first_name``/``last_name``, a
customer's ``full_name``, a booking's passengers, the arguments of a lookup by name. :func:`stated`
collects those values (from tool calls, tool results and strings holding JSON), and :class:`Names`
finds them in any text: the whole name, and each part of it on its own, as whole words, ignoring case
and accents (``Muller`` is ``Müller``).

A bare ``name`` key is taken only inside a person: under a key such as ``user``, ``customer`` or
``passengers``, or beside an ``email``, ``phone`` or date of birth (a product's or a plan's ``name``
is not a person's). What a hostile value can make of this is bounded: a value over
:data:`MAX_NAME_CHARS` characters or of more than :data:`MAX_NAME_WORDS` words is no name; a part of
one letter, or a common English word (``the``, ``and``) is never redacted on its own, a two-letter
part (``Li``, ``Wu``) only when written with a capital, and a part of up to three letters not when
written in capitals (``MIA``, Miami's airport code, is not ``Mia``). Matching reads each word once and
looks it up in a set, so its time is linear in the text whatever the names hold; no name becomes a
pattern.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

MAX_NAME_CHARS = 100
MAX_NAME_WORDS = 6
MAX_GAP = 3  # characters between two words of one name as written: "Mei Kovacs", "O'Brien", "Jean - Luc"
_MAX_EMBEDDED = 4  # levels of JSON inside a JSON string read for names

# Keys whose string value is a person's name, compared lowercased without separators (first_name,
# firstName and "First Name" are one key).
NAME_KEYS = frozenset(
    {
        "firstname", "lastname", "middlename", "fullname", "givenname", "familyname", "surname", "forename",
        "username", "customername", "passengername", "contactname", "cardholdername", "cardholder",
        "holdername", "accountholdername", "accountholder", "recipientname", "sendername", "travelername",
        "travellername", "guestname", "patientname", "membername", "employeename", "displayname", "legalname",
        "personname", "callername",
    }
)  # fmt: skip
# A bare "name" is a person's under one of these keys, or beside one of _PERSONAL.
_PEOPLE = frozenset(
    {
        "user", "users", "customer", "customers", "passenger", "passengers", "savedpassengers", "contact",
        "contacts", "traveler", "travelers", "traveller", "travellers", "guest", "guests", "patient", "patients",
        "member", "members", "employee", "employees", "person", "people", "profile", "userprofile",
        "cardholder", "accountholder", "recipient", "sender", "caller", "author", "emergencycontact",
    }
)  # fmt: skip
_PERSONAL = frozenset(
    {"email", "emailaddress", "phone", "phonenumber", "dob", "dateofbirth", "birthdate", "birthday", "ssn"}
)
# Never redacted on their own (a value "The" must not take every "the" of a text); as part of a whole
# name they are.
_COMMON = frozenset(
    {
        "the", "and", "for", "are", "but", "not", "you", "your", "all", "any", "can", "her", "his", "him", "she",
        "they", "them", "their", "was", "were", "one", "our", "out", "has", "had", "have", "who", "what", "when",
        "where", "why", "how", "its", "with", "this", "that", "from", "will", "would", "may", "might", "must",
        "shall", "should", "could", "into", "onto", "than", "then", "there", "here", "also", "just", "only", "very",
        "more", "most", "some", "such", "each", "both", "few", "own", "same", "other", "about", "above", "after",
        "again", "below", "between", "during", "under", "over", "off", "yes", "no", "ok", "okay", "hello", "hi",
        "hey", "dear", "thanks", "thank", "please", "sir", "madam", "mr", "mrs", "ms", "miss", "dr", "user",
        "customer", "agent", "name", "first", "last", "full",
    }
)  # fmt: skip

_WORD = re.compile(r"[^\W_](?:[^\W_]|[\u0300-\u036f])*")  # a word, with the accents written after its letters
_KEY_SEPARATORS = re.compile(r"[\W_]+")


def key_form(key: str) -> str:
    """``key`` as :data:`NAME_KEYS` holds it: ``firstName`` and ``first_name`` are ``firstname``."""
    return _KEY_SEPARATORS.sub("", key).lower()


def fold(word: str) -> str:
    """A word as names are compared: case and accents dropped."""
    if word.isascii():
        return word.lower()
    decomposed = unicodedata.normalize("NFKD", word)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def stated(obj: Any, keys: frozenset[str] = NAME_KEYS) -> set[str]:
    """The names ``obj`` (messages, tool calls, tool results: dicts, lists, strings holding JSON) states
    under ``keys`` (in :func:`key_form`), and under ``name`` inside a person."""
    out: set[str] = set()
    stack: list[tuple[Any, str, int]] = [(obj, "", 0)]  # a value, the key it stands under, JSON levels read
    while stack:
        value, under, level = stack.pop()
        if isinstance(value, dict):
            keys_here = {key_form(k) for k in value if isinstance(k, str)}
            person = under in _PEOPLE or bool(keys_here & _PERSONAL)
            here: list[str] = []
            for k, v in value.items():
                key = key_form(k) if isinstance(k, str) else ""
                if isinstance(v, str) and (key in keys or (key == "name" and person)):
                    here.append(v)
                stack.append((v, key, level))
            out.update(here)
            if 1 < len(here) <= 3:  # first and last name: whole as "Mei Kovacs" and as "Kovacs, Mei"
                out.update((" ".join(here), " ".join(reversed(here))))
        elif isinstance(value, list | tuple):
            stack.extend((v, under, level) for v in value)
        elif isinstance(value, str) and level < _MAX_EMBEDDED and value.lstrip()[:1] in ("{", "["):
            try:
                stack.append((orjson.loads(value), under, level + 1))
            except orjson.JSONDecodeError:  # also nesting past orjson's limit: no names read from it
                continue
    return out


class Names:
    """Where the names given occur in a text: whole names, and each part of at least two letters."""

    def __init__(self, names: Iterable[str]) -> None:
        self.whole: set[tuple[str, ...]] = set()
        self.parts: set[str] = set()
        for name in names:
            if len(name) > MAX_NAME_CHARS:
                continue
            words = tuple(fold(w) for w in _WORD.findall(name))
            parts = [w for w in words if len(w) >= 2 and not w.isdigit() and w not in _COMMON]
            if not parts or len(words) > MAX_NAME_WORDS:
                continue
            self.parts.update(parts)
            if len(words) > 1:
                self.whole.add(words)
        self.firsts = {w[0] for w in self.whole} | self.parts
        self.longest = max((len(w) for w in self.whole), default=1)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        """Spans of ``text`` that are a name or a part of one, without overlaps."""
        if not self.parts:
            return
        words = [(m.start(), m.end(), fold(m.group(0))) for m in _WORD.finditer(text)]
        i = 0
        while i < len(words):
            if words[i][2] not in self.firsts:
                i += 1
                continue
            n = self._whole_at(text, words, i)
            if n:
                yield words[i][0], words[i + n - 1][1]
                i += n
                continue
            start, end, _ = words[i]
            if self._part(text[start:end], words[i][2]):
                yield start, end
            i += 1

    def _part(self, written: str, word: str) -> bool:
        """A part of a name on its own, as ``written``: one of two letters only capitalised (``Li``, not
        the "li" of a text), none of three letters or less in capitals (``MIA`` is Miami's airport, not Mia)."""
        if word not in self.parts:
            return False
        if written.isupper():
            return len(written) > 3
        return len(written) > 2 or written[0].isupper()

    def _whole_at(self, text: str, words: list[tuple[int, int, str]], i: int) -> int:
        """How many words from ``i`` on are one whole name (0: none), the longest name first."""
        for n in range(min(self.longest, len(words) - i), 1, -1):
            if tuple(w for _, _, w in words[i : i + n]) not in self.whole:
                continue
            gaps = (text[words[k][1] : words[k + 1][0]] for k in range(i, i + n - 1))
            if all(len(g) <= MAX_GAP and "\n" not in g for g in gaps):
                return n
        return 0
