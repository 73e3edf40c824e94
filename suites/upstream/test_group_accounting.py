"""The group accounting of the upstream hosts (``harness.upstream.group_accounting``) as a
pure state machine, against a shadow model.

The machine plays upstream's part, fully-async or one-step (drawn first): it takes groups
(each into a group task at once, as ``_submit_one_group`` / ``submit_generate_tasks`` do),
finishes their tasks, hands them to the fully-async worker, which puts them itself or
hands them to a publish task that puts them (the two-wave worker of the refactor's tip), keeps or rejects
them, recycles, drops or trains them, and can lose one the way a broken upstream does (a
queued group that vanishes, a group task the worker forgets). The shadow keeps one place
per live group; what the accounting must say follows from it: the pending groups, the
lost ones, and whether a lost group was seen again. The seeded accounting bugs at the end
are each caught by the machine.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable

import pytest

import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.upstream.group_accounting import LIVE, RECYCLED, GroupAccounting

# where a live group is, in the shadow; the holders are every place but DONE (a finished
# one-step task before its rollout ends) and VANISHED (held by nothing)
RUNNING, DONE, HELD, PUBLISHING, PUTTING, BUFFER, SOURCE, VANISHED = (
    "running",
    "done",
    "held",
    "publishing",
    "putting",
    "buffer",
    "source",
    "vanished",
)
HOLDERS = frozenset({RUNNING, HELD, PUBLISHING, PUTTING, BUFFER, SOURCE})


class AccountingMachine(RuleBasedStateMachine):
    accounting_cls: type[GroupAccounting] = GroupAccounting

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.next_group = 0
        self.next_task = 0
        self.loc: dict[int, str] = {}  # live group -> where upstream holds it
        self.state: dict[int, str] = {}  # live group -> LIVE | RECYCLED
        self.task_of: dict[int, str] = {}  # live group -> its latest group task
        self.publish_task_of: dict[int, str] = {}  # live group -> the publish task holding it
        self.finished: set[str] = set()
        self.lost: set[int] = set()
        self.sighted_lost = False
        self.taken_this_generate: list[int] = []
        self.acc: GroupAccounting = self.accounting_cls(fully_async=False)
        self.fully = False

    @initialize(fully=st.booleans())
    def start(self, fully: bool) -> None:
        self.fully = fully
        self.acc = self.accounting_cls(fully_async=fully)

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def at(self, *places: str) -> list[int]:
        return sorted(gi for gi, where in self.loc.items() if where in places and gi not in self.lost)

    def gone(self, gi: int) -> None:
        self.loc.pop(gi)
        self.state.pop(gi)

    def _submit(self, gi: int) -> None:
        task = f"t{self.next_task}"
        self.next_task += 1
        self.acc.taken(gi, self.tick())
        self.acc.task_created(task, gi, self.tick())
        self.loc[gi], self.state[gi], self.task_of[gi] = RUNNING, LIVE, task
        self.taken_this_generate.append(gi)

    # --- both drivers ---------------------------------------------------------------------
    @rule()
    def take_fresh(self) -> None:
        gi = self.next_group
        self.next_group += 1
        self._submit(gi)

    @precondition(lambda self: self.at(SOURCE))
    @rule(data=st.data())
    def take_recycled(self, data: st.DataObject) -> None:
        self._submit(data.draw(st.sampled_from(self.at(SOURCE))))

    @precondition(lambda self: self.at(SOURCE, BUFFER))
    @rule(data=st.data())
    def upstream_loses_a_queued_group(self, data: st.DataObject) -> None:
        self.loc[data.draw(st.sampled_from(self.at(SOURCE, BUFFER)))] = VANISHED

    @precondition(lambda self: self.lost)
    @rule(data=st.data(), where=st.sampled_from(["taken", "recycled", "put", "trained", "queued"]))
    def a_lost_group_shows_up_again(self, data: st.DataObject, where: str) -> None:
        gi = data.draw(st.sampled_from(sorted(self.lost)))
        if where == "taken":
            self.acc.taken(gi, self.tick())
        elif where == "recycled":
            self.acc.recycled(gi, self.tick())
        elif where == "put":
            self.acc.put_started(gi, self.tick())
            self.acc.put_ended(gi)
        elif where == "trained":
            self.acc.trained([gi], 0, self.tick())
        else:
            self.acc.unaccounted({gi}, self.finished, self.tick())
        self.sighted_lost = True
        # the accounting's word on it is now wrong whatever it says next: the run stops here
        # with a harness error (RunnerAccountingError); the machine stops following it
        self.loc.pop(gi, None)
        self.state.pop(gi, None)

    def _check_after_rollout(self) -> None:
        queued = {gi for gi, where in self.loc.items() if where in (SOURCE, BUFFER)}
        expected = {gi for gi, where in self.loc.items() if gi not in self.lost and where not in HOLDERS}
        missing = self.acc.unaccounted(queued, self.finished, self.tick())
        assert self.sighted_lost or missing == expected, (
            f"declared lost after a rollout: {sorted(missing)}, expected {sorted(expected)}"
        )
        self.lost |= expected

    # --- one-step -------------------------------------------------------------------------
    @precondition(lambda self: not self.fully and self.at(RUNNING))
    @rule(data=st.data())
    def group_task_finishes(self, data: st.DataObject) -> None:
        gi = data.draw(st.sampled_from(self.at(RUNNING)))
        self.finished.add(self.task_of[gi])
        self.loc[gi] = DONE

    @precondition(lambda self: not self.fully and self.at(DONE))
    @rule(data=st.data())
    def dynamic_filter_rejects(self, data: st.DataObject) -> None:
        gi = data.draw(st.sampled_from(self.at(DONE)))
        self.acc.dropped(gi)
        self.gone(gi)

    @precondition(lambda self: not self.fully and self.at(DONE))
    @rule(data=st.data())
    def aborted_group_recycled(self, data: st.DataObject) -> None:
        gi = data.draw(st.sampled_from(self.at(DONE)))
        self.acc.recycled(gi, self.tick())
        self.loc[gi], self.state[gi] = SOURCE, RECYCLED

    @precondition(lambda self: not self.fully)
    @rule(data=st.data())
    def one_step_rollout_ends(self, data: st.DataObject) -> None:
        returned = set(data.draw(st.lists(st.sampled_from(self.at(DONE)), unique=True))) if self.at(DONE) else set()
        self.acc.trained(returned, 0, self.tick())
        for gi in returned:
            self.gone(gi)
        running = self.acc.running(self.finished)
        assert running == set(self.at(RUNNING)), f"running groups {sorted(running)}"
        expected_drops = []
        for gi in self.taken_this_generate:
            if gi in self.loc and gi not in returned and self.loc[gi] != RUNNING and self.state[gi] == LIVE:
                if gi not in expected_drops:
                    expected_drops.append(gi)
                    self.gone(gi)
        drops = self.acc.not_returned(self.taken_this_generate, returned, running)
        assert self.sighted_lost or drops == expected_drops, (
            f"dropped as not returned: {drops}, expected {expected_drops}"
        )
        self.taken_this_generate = []
        self._check_after_rollout()

    # --- fully async ----------------------------------------------------------------------
    @precondition(lambda self: self.fully and self.at(RUNNING))
    @rule(data=st.data())
    def worker_wait_returns(self, data: st.DataObject) -> None:
        done = data.draw(st.lists(st.sampled_from(self.at(RUNNING)), min_size=1, unique=True))
        self.acc.worker_woke([self.task_of[gi] for gi in done], self.tick())
        for gi in done:
            self.loc[gi] = HELD

    @precondition(lambda self: self.fully)
    @rule(data=st.data())
    def worker_waits_again(self, data: st.DataObject) -> None:
        waited = self.at(RUNNING, PUBLISHING)
        forgotten = set(data.draw(st.lists(st.sampled_from(waited), unique=True))) if waited else set()
        pendings = {self.task_of[gi] for gi in self.at(RUNNING) if gi not in forgotten}
        pendings |= {self.publish_task_of[gi] for gi in self.at(PUBLISHING) if gi not in forgotten}
        self.acc.worker_waits(pendings, self.tick())
        # every group the last wait returned that was not put or handed on, and every forgotten task's
        self.lost |= set(self.at(HELD)) | forgotten

    @precondition(lambda self: self.fully and self.at(HELD))
    @rule(data=st.data())
    def worker_hands_a_group_to_a_publish_task(self, data: st.DataObject) -> None:
        gi = data.draw(st.sampled_from(self.at(HELD)))
        task = f"p{self.next_task}"
        self.next_task += 1
        self.acc.publish_created(task, gi, self.tick())
        self.loc[gi], self.publish_task_of[gi] = PUBLISHING, task

    @precondition(lambda self: self.fully and self.at(HELD, PUBLISHING))
    @rule(data=st.data(), accepted=st.booleans())
    def worker_puts(self, data: st.DataObject, accepted: bool) -> None:
        gi = data.draw(st.sampled_from(self.at(HELD, PUBLISHING)))
        self.acc.put_started(gi, self.tick())
        self.loc[gi] = PUTTING
        if data.draw(st.booleans(), label="the put returns now"):
            self.acc.put_ended(gi)
            if accepted:
                self.loc[gi] = BUFFER
            else:  # the buffer's dynamic filter rejects it
                self.acc.dropped(gi)
                self.gone(gi)

    @precondition(lambda self: self.fully and self.at(PUTTING))
    @rule(data=st.data())
    def a_blocked_put_returns(self, data: st.DataObject) -> None:
        gi = data.draw(st.sampled_from(self.at(PUTTING)))
        self.acc.put_ended(gi)
        self.loc[gi] = BUFFER

    @precondition(lambda self: self.fully and self.at(BUFFER))
    @rule(data=st.data(), handler=st.sampled_from(["retry", "drop"]))
    def stale_group_handled(self, data: st.DataObject, handler: str) -> None:
        gi = data.draw(st.sampled_from(self.at(BUFFER)))
        if handler == "retry":
            self.acc.recycled(gi, self.tick())
            self.loc[gi], self.state[gi] = SOURCE, RECYCLED
        else:
            self.acc.dropped(gi)
            self.gone(gi)

    @precondition(lambda self: self.fully)
    @rule(data=st.data())
    def drain(self, data: st.DataObject) -> None:
        got = set(data.draw(st.lists(st.sampled_from(self.at(BUFFER)), unique=True))) if self.at(BUFFER) else set()
        self.acc.trained(got, 0, self.tick())
        for gi in got:
            self.gone(gi)
        self._check_after_rollout()

    # --- what the accounting says at every step -------------------------------------------
    @invariant()
    def pending_is_every_live_group_not_lost(self) -> None:
        expected = sorted(gi for gi in self.loc if gi not in self.lost)
        if not self.sighted_lost:
            assert self.acc.pending() == expected, f"pending {self.acc.pending()}, expected {expected}"

    @invariant()
    def lost_is_what_upstream_lost(self) -> None:
        if not self.sighted_lost:
            assert self.acc.lost == self.lost, f"lost {sorted(self.acc.lost)}, expected {sorted(self.lost)}"

    @invariant()
    def a_lost_group_seen_again_is_a_problem(self) -> None:
        assert bool(self.acc.problems) == self.sighted_lost, f"problems {self.acc.problems}"


TestAccountingMachine = AccountingMachine.TestCase
TestAccountingMachine.settings = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- unit tests


def test_a_group_task_holds_its_group_from_creation_until_the_worker_is_handed_it():
    acc = GroupAccounting(fully_async=True)
    acc.taken(6, 1.0)
    acc.task_created("t6", 6, 1.0)
    assert acc.unaccounted(set(), set(), 2.0) == set()  # created, not yet run: held
    acc.worker_woke(["t6"], 3.0)
    assert acc.unaccounted(set(), set(), 4.0) == set()  # in the worker's hands, not yet put
    acc.worker_waits(set(), 5.0)  # the worker waits again without having put it
    assert acc.lost == {6} and acc.pending() == []
    assert acc.lost_why[6] == "t=5: returned by the worker's wait and not put before its next wait"


def test_a_one_step_group_task_holds_its_group_until_it_finishes():
    acc = GroupAccounting(fully_async=False)
    acc.taken(1, 1.0)
    acc.task_created("t1", 1, 1.0)
    assert acc.running(set()) == {1} and acc.not_returned([1], set(), {1}) == []
    assert acc.running({"t1"}) == set() and acc.not_returned([1], set(), set()) == [1]
    assert acc.pending() == []


def test_a_recycled_group_is_not_discarded_as_not_returned_and_stays_pending():
    acc = GroupAccounting(fully_async=False)
    acc.taken(2, 1.0)
    acc.recycled(2, 2.0)
    assert acc.not_returned([2], set(), set()) == []
    assert acc.unaccounted({2}, set(), 3.0) == set() and acc.pending() == [2]


def test_a_lost_group_seen_again_names_where_it_was_declared_lost_and_where_it_showed_up():
    acc = GroupAccounting(fully_async=True)
    acc.taken(3, 1.0)
    acc.task_created("t3", 3, 1.0)
    acc.worker_waits(set(), 2.0)  # the worker forgot the task
    acc.unaccounted({3}, set(), 7.5)  # and then it is in the buffer
    assert acc.take_problems() == [
        "group 3 declared lost (t=2: its group task is not among those the worker waits on) "
        "and then at t=7.5: queued in the data source or the buffer"
    ]
    assert acc.take_problems() == []


def test_trained_groups_are_sighted_in_order_and_leave_the_accounting():
    acc = GroupAccounting(fully_async=True)
    for gi in (5, 4):
        acc.taken(gi, 0.0)
    acc.lost = {4, 5}
    acc.trained([5, 4, 5], 3, 1.0)
    assert [p.split(" declared")[0] for p in acc.problems] == ["group 4", "group 5"]
    assert all("returned by rollout 3 for training" in p for p in acc.problems)
    assert acc.live == {}


def test_a_publish_task_holds_its_group_from_its_creation_until_its_put_starts():
    acc = GroupAccounting(fully_async=True)
    acc.taken(4, 1.0)
    acc.task_created("t4", 4, 1.0)
    acc.worker_woke(["t4"], 2.0)
    acc.publish_created("p4", 4, 2.0)  # the two-wave worker hands the finished group on
    acc.worker_waits({"p4"}, 3.0)  # and waits on the publish task with its group tasks
    assert acc.unaccounted(set(), {"t4"}, 4.0) == set() and acc.lost == set()
    acc.put_started(4, 5.0)
    assert acc.publishing == {} and acc.putting == {4}
    acc.put_ended(4)
    assert acc.unaccounted({4}, {"t4"}, 6.0) == set() and acc.pending() == [4]


def test_a_publish_task_the_worker_no_longer_waits_on_before_its_put_began_loses_its_group():
    acc = GroupAccounting(fully_async=True)
    acc.taken(5, 1.0)
    acc.task_created("t5", 5, 1.0)
    acc.worker_woke(["t5"], 2.0)
    acc.publish_created("p5", 5, 2.0)
    acc.worker_waits(set(), 3.0)
    assert acc.lost == {5} and acc.pending() == []
    assert acc.lost_why[5] == "t=3: its publish task, its put not begun, is not among those the worker waits on"


def test_a_group_handed_to_a_publish_task_puts_its_group_task_in_the_workers_hands_without_a_followed_wait():
    # the tip's worker waits with asyncio.wait once its two waves are full (L160-L161), a
    # wait the host does not follow: reading the group task's result is what hands it over
    acc = GroupAccounting(fully_async=True)
    acc.taken(6, 1.0)
    acc.task_created("t6", 6, 1.0)
    acc.publish_created("p6", 6, 2.0)
    acc.worker_waits({"p6"}, 3.0)
    assert acc.lost == set() and acc.returned_tasks == {"t6"}


# --------------------------------------------------------------------------- seeded bugs


class RetriedCountedAsTrained(GroupAccounting):
    """A group the retry handler puts back into the data source is counted as gone."""

    def recycled(self, gi: int, now: float) -> None:
        super().recycled(gi, now)
        self.live.pop(gi)


class DroppedNotCounted(GroupAccounting):
    """A dropped group stays live: listed as pending at the run's end."""

    def dropped(self, gi: int) -> None:
        pass


class TrainedStaysLive(GroupAccounting):
    """A group returned for training stays live."""

    def trained(self, gis: Iterable[int], rollout_id: int, now: float) -> None:
        for gi in sorted(set(gis)):
            self.seen(gi, f"returned by rollout {rollout_id} for training", now)


class WorkerHandsHoldNothing(GroupAccounting):
    """A group the worker's wait returned is held by nothing until its put."""

    def worker_woke(self, done: Iterable[Hashable], now: float) -> None:
        self.returned_tasks |= set(done)


class ForgottenTaskNotLost(GroupAccounting):
    """A group task the worker no longer waits on still counts as holding its group."""

    def worker_waits(self, pendings: Collection[Hashable], now: float) -> None:
        self._declare_lost(self.held, "returned by the worker's wait and not put before its next wait", now)
        self.held = set()


class PutHoldsNothing(GroupAccounting):
    """A group inside a put (blocked on a full buffer) is held by nothing."""

    def put_started(self, gi: int, now: float) -> None:
        self.seen(gi, "put to the buffer", now)
        self.held.discard(gi)


class PublishTaskHoldsNothing(GroupAccounting):
    """A group the two-wave worker handed to a publish task is held by nothing until its put."""

    def publish_created(self, task: Hashable, gi: int, now: float) -> None:
        self.returned_tasks |= {t for t, g in self.task_group.items() if g == gi}
        self.held.discard(gi)


class SightingsIgnored(GroupAccounting):
    """A lost group seen again is not recorded: the self-check never fires."""

    def seen(self, gi: int, where: str, now: float) -> None:
        pass


SEEDED_BUGS = [
    RetriedCountedAsTrained,
    DroppedNotCounted,
    TrainedStaysLive,
    WorkerHandsHoldNothing,
    ForgottenTaskNotLost,
    PutHoldsNothing,
    PublishTaskHoldsNothing,
    SightingsIgnored,
]


@pytest.mark.parametrize("bug", SEEDED_BUGS, ids=[b.__name__ for b in SEEDED_BUGS])
def test_the_machine_catches_a_seeded_accounting_bug(bug: type[GroupAccounting]) -> None:
    machine = type(f"AccountingMachine_{bug.__name__}", (AccountingMachine,), {"accounting_cls": bug})
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=1000,  # a search budget: the first failing example ends the run
                derandomize=True,
                database=None,
                deadline=None,
                report_multiple_bugs=False,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            ),
        )
