"""Each card's last patrol in the ledger's file (spawner/patrol.py says what a patrol is).

A failed card stays out of placement until an admin clears it: a later patrol that passes does not put
it back by itself (a card that fails now and then is the one to look at).
"""

from __future__ import annotations

from spawner.ledger import Ledger
from spawner.patrol import CardHealth, Check, unhealthy


class CardLedger(Ledger):
    """The ledger's ``card_health`` table."""

    def health(self) -> list[CardHealth]:
        query = "SELECT gpu_index, healthy, message, checked, cleared_by FROM card_health ORDER BY gpu_index"
        rows = self._read_only(lambda db: db.execute(query).fetchall())
        return [CardHealth(int(g), bool(h), str(m), float(c), str(b)) for g, h, m, c, b in rows]

    def out_of_placement(self) -> set[int]:
        return unhealthy(self.health())

    def record_check(self, check: Check) -> CardHealth:
        """A patrol's result: a failure takes the card out; a pass leaves a failed card out all the same."""
        with self._write() as db:
            row = db.execute("SELECT healthy FROM card_health WHERE gpu_index = ?", (check.gpu,)).fetchone()
            healthy = check.healthy and (row is None or bool(row[0]))
            db.execute(
                "INSERT OR REPLACE INTO card_health (gpu_index, healthy, message, checked, cleared_by)"
                " VALUES (?, ?, ?, ?, '')",
                (check.gpu, int(healthy), check.message, check.checked),
            )
        return CardHealth(check.gpu, healthy, check.message, check.checked)

    def clear(self, gpu: int, by: str) -> bool:
        """An admin puts a card back in placement; whether it was out."""
        with self._write() as db:
            changed = db.execute(
                "UPDATE card_health SET healthy = 1, cleared_by = ? WHERE gpu_index = ? AND healthy = 0", (by, gpu)
            ).rowcount
        return bool(changed)
