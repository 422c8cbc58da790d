"""Synthetic support-agent traffic for demos and benchmarks (``vigil simulate``).

Each conversation is a retail support exchange of about 12 messages and 4 tool calls. Each agent
version has a failure rate; a failing conversation carries one realistic defect (cancelling a
delivered order, writing without confirmation, leaking an email, a tool erroring, the user having
to repeat themselves, a truncated reply). Outcome signals follow defects with higher probability.

Nothing is stamped after the simulator's clock: a conversation that would end later ends now, and an
outcome whose delay has not yet passed happened now (the simulator sends it at once, after its
conversation).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

DEFECTS = ("cancel_delivered", "no_confirmation", "pii_leak", "tool_errors", "user_repeats", "truncated")

FIRST = ["Ava", "Liam", "Noah", "Mia", "Omar", "Yuki", "Sofia", "Ravi", "Chen", "Lena"]
LAST = ["Lopez", "Smith", "Khan", "Garcia", "Ito", "Novak", "Brown", "Patel", "Silva", "Moreau"]
ITEMS = ["desk lamp", "water bottle", "hiking boots", "mechanical keyboard", "yoga mat", "espresso maker"]


@dataclass(frozen=True)
class VersionProfile:
    agent_id: str
    version: str
    failure_rate: float
    weight: float = 1.0


def parse_versions(spec: str, agent_id: str = "support-bot") -> list[VersionProfile]:
    """``v1:0.05,v2:0.15`` (version:failure_rate[:weight]) into profiles."""
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        bits = part.split(":")
        if len(bits) not in (2, 3):
            raise ValueError(f"version spec {part!r} must be version:failure_rate[:weight]")
        rate = float(bits[1])
        if not 0 <= rate <= 1:
            raise ValueError(f"failure rate {rate} of {bits[0]} must be within 0..1")
        out.append(VersionProfile(agent_id, bits[0], rate, float(bits[2]) if len(bits) == 3 else 1.0))
    if not out:
        raise ValueError("at least one version is needed")
    return out


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }


class Simulator:
    def __init__(
        self,
        profiles: list[VersionProfile],
        seed: int = 0,
        outcome_rate_scale: float = 1.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.profiles = profiles
        self.now = now
        self.rng = random.Random(seed)
        self.weights = [p.weight for p in profiles]
        self.outcome_scale = outcome_rate_scale
        self.seed = seed

    def stream(self, count: int | None = None, start: datetime | None = None) -> Iterator[dict[str, Any]]:
        n = 0
        t = start or self.now()
        while count is None or n < count:
            profile = self.rng.choices(self.profiles, self.weights)[0]
            yield self.conversation(profile, t)
            n += 1
            t += timedelta(milliseconds=50)

    def conversation(self, p: VersionProfile, at: datetime) -> dict[str, Any]:
        r = self.rng
        defect = r.choice(DEFECTS) if r.random() < p.failure_rate else None
        name = f"{r.choice(FIRST)} {r.choice(LAST)}"
        user_id = name.lower().replace(" ", "_") + f"_{r.randint(1000, 9999)}"
        order = f"#W{r.randint(1000000, 9999999)}"
        item = r.choice(ITEMS)
        price = round(r.uniform(15, 400), 2)
        status = "delivered" if defect == "cancel_delivered" else "pending"
        email = f"{user_id}@example.com"
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a retail support agent. Confirm before any write action."},
            {
                "role": "user",
                "content": f"Hi, I want to cancel my order {order}, the {item}. My name is {name}.",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", "find_user_id_by_name", {"name": name})],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "content": orjson.dumps({"user_id": user_id, "email": email}).decode(),
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1b", "get_user_details", {"user_id": user_id})],
            },
            {
                "role": "tool",
                "tool_call_id": "c1b",
                "content": orjson.dumps(
                    {
                        "user_id": user_id,
                        "orders": [order],
                        "payment_methods": ["credit_card_" + str(r.randint(100, 999))],
                    }
                ).decode(),
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c2", "get_order_details", {"order_id": order})],
            },
        ]
        if defect == "tool_errors":
            msgs.append({"role": "tool", "tool_call_id": "c2", "content": "Error: upstream timeout", "is_error": True})
            msgs.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [_call("c2b", "get_order_details", {"order_id": order})],
                }
            )
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": "c2b",
                    "content": "Error: upstream timeout",
                    "is_error": True,
                }
            )
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": "c2" if defect != "tool_errors" else "c2c",
                "content": orjson.dumps(
                    {"order_id": order, "status": status, "items": [{"name": item, "price": price}]}
                ).decode(),
            }
        )
        if defect == "tool_errors":
            msgs[-1]["tool_call_id"] = "c2c"
            msgs.insert(
                -1,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [_call("c2c", "get_order_details", {"order_id": order})],
                },
            )
        leak = f" I also see your email is {email}." if defect == "pii_leak" else ""
        ask = (
            f"I found order {order} for the {item} (${price:.2f}), status {status}.{leak} "
            f"Shall I cancel it and refund ${price:.2f} to your original payment method?"
        )
        if defect == "pii_leak":
            msgs[1]["content"] = f"Hi, I want to cancel my order {order}, the {item}."
        msgs.append({"role": "assistant", "content": ask})
        if defect == "user_repeats":
            msgs.append({"role": "user", "content": f"I said I want to cancel my order {order} for the {item}."})
            msgs.append({"role": "assistant", "content": f"Understood. Do you confirm cancelling {order}?"})
            msgs.append({"role": "user", "content": f"I want to cancel my order {order}, the {item}, please!"})
            msgs.append({"role": "assistant", "content": "Sorry about that. Please confirm with yes."})
        if defect == "no_confirmation":
            msgs.append({"role": "user", "content": "Hmm, what would the refund timeline be?"})
        else:
            msgs.append({"role": "user", "content": "Yes, please go ahead."})
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c3", "cancel_pending_order", {"order_id": order, "reason": "no longer needed"})],
            }
        )
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": "c3",
                "content": orjson.dumps({"order_id": order, "status": "cancelled", "refund": price}).decode(),
            }
        )
        final = (
            f"Your order {order} is cancelled and ${price:.2f} will be refunded within 5-7 business days. "
            "Is there anything else I can help with?"
        )
        if defect == "truncated":
            final = f"Your order {order} is cancelled and the refund of ${price:.2f} will be sent to your"
        msgs.append({"role": "assistant", "content": final})
        cid = str(uuid.UUID(int=self.rng.getrandbits(128)))
        tokens = 900 + 140 * len(msgs) + r.randint(0, 400)
        task_id = f"cancel-order-{self.rng.randint(1, 50)}"
        ended = at + timedelta(seconds=r.uniform(20, 120))
        # conversations are stamped 50 ms apart however fast they are made: 1,000 of them ended 50 s ahead
        late = ended - self.now()
        if late > timedelta(0):
            at, ended = at - late, ended - late
        return {
            "conversation_id": cid,
            "revision": 1,
            "status": "finished",
            "agent_id": p.agent_id,
            "agent_version": p.version,
            "task_id": task_id,
            "intent": "cancel_order",
            "started_at": at.isoformat(),
            "ended_at": ended.isoformat(),
            "messages": msgs,
            "usage": {
                "prompt_tokens": tokens - 200,
                "completion_tokens": 200,
                "total_tokens": tokens,
                "cost_usd": round(tokens * 2.5e-6, 6),
                "latency_ms": round(r.uniform(800, 6000), 1),
            },
            "metadata": {
                "tenant": "demo",
                "channel": r.choice(["chat", "email"]),
                "simulated_defect": defect,
            },
        }

    def outcomes_for(self, conv: dict[str, Any]) -> list[dict[str, Any]]:
        """Later business signals: more likely after a defect."""
        r = self.rng
        bad = conv["metadata"].get("simulated_defect") is not None
        s = self.outcome_scale
        out = []
        ended = datetime.fromisoformat(conv["ended_at"])
        now = max(self.now(), ended)
        for kind, p_bad, p_good, delay_h in (
            ("escalation", 0.30, 0.03, 0.1),
            ("thumbs_down", 0.35, 0.04, 0.01),
            ("refund_reversal", 0.10, 0.005, 48),
            ("reopened_ticket", 0.15, 0.02, 24),
            ("thumbs_up", 0.05, 0.40, 0.01),
        ):
            if r.random() < (p_bad if bad else p_good) * s:
                out.append(
                    {
                        "conversation_id": conv["conversation_id"],
                        "type": kind,
                        "value": 1.0,
                        # a refund reversal 48 h on, sent with its conversation, was dated two days ahead
                        "occurred_at": min(ended + timedelta(hours=delay_h * r.uniform(0.5, 1.5)), now).isoformat(),
                        "idempotency_key": f"{conv['conversation_id']}:{kind}",
                    }
                )
        # whether the task got done, for every conversation (the demo's task ids repeat, so compare shows
        # pass^k); drawn from its own generator so the outcomes above stay what they were for a seed
        done = random.Random(f"{conv['conversation_id']}:task_success").random() >= (0.5 if bad else 0.04)
        out.append(
            {
                "conversation_id": conv["conversation_id"],
                "type": "task_success",
                "value": 1.0 if done else 0.0,
                "occurred_at": ended.isoformat(),
                "idempotency_key": f"{conv['conversation_id']}:task_success",
            }
        )
        return out

    @staticmethod
    def new_id() -> str:
        return str(uuid.uuid4())
