"""Sample texts the heuristic token counter was calibrated against.

Kept in the package so the calibration can be checked anywhere: the tests and
``scripts/bench_conversation.py`` compare `HeuristicTokenCounter` with the BPE counts on these
three corpora (and on held-out text found on the machine). They are original texts written
for this purpose, in the shapes a chat with tools produces: prose from users and assistants,
code and JSON from tools, and Korean, where characters/4 is furthest off.
"""

from __future__ import annotations

ENGLISH_PROSE = """\
The lighthouse on the northern cape was switched off in the spring, after almost a century of
work. Nobody in the village could remember a winter without its slow white sweep across the
water, and for a few weeks people kept glancing at the dark tower as if it had simply forgotten
to wake up. The keeper's cottage had been empty for years; the lamp had been automatic since
the seventies, and a technician from the mainland came twice a year to change the bulbs and
check the batteries. Still, the light had felt like a person, and its absence felt like one too.

Ships no longer need it, of course. Satellite navigation tells a captain where she is to within
a few metres, and the charts on her screen update themselves overnight. The harbour master said
as much at the meeting in the school hall, patiently and more than once, while the older
fishermen shook their heads. Their objection was not really about safety. It was about the
evenings, about walking home along the sea wall with the beam passing overhead every twelve
seconds, steady as a heartbeat, and knowing exactly how far you had come.

What surprised me most, when I began asking around, was how many people had a story attached
to the tower. A retired teacher told me she had learned to count by watching the flashes from
her bedroom window. A young mechanic described proposing to his wife on the gallery, having
bribed the technician with a bottle of whisky for the key. An old man who had spent forty years
on trawlers admitted, a little embarrassed, that he used to talk to the light on bad nights,
and that he was fairly sure it had answered him once, during the storm of 1987, by appearing
exactly where he needed it to be.

The council has now proposed turning the building into a small museum, with a café on the
ground floor and a viewing platform at the top. The plan is sensible, and it will probably
bring a few more visitors in the summer months. But sensible plans have a way of missing the
point. A museum explains things; a lighthouse simply keeps going, night after night, whether
anyone is watching or not. That quiet reliability is what people miss, and it is hard to see
how a gift shop could replace it.

If there is a lesson here, it may be that the most valuable tools are the ones we stop noticing.
We only understand what they were doing for us when they fall silent, and by then the habits
they supported have already started to fade. Before we retire something that works, it is
worth asking not only whether we still need its function, but also what else it was quietly
holding together.
"""

CODE = '''\
import asyncio
import json
from dataclasses import dataclass, field


@dataclass
class RetryPolicy:
    """How often and how patiently a failed request is retried."""

    attempts: int = 3
    base_delay: float = 0.25
    retry_on: tuple[int, ...] = (429, 500, 502, 503)
    history: list[float] = field(default_factory=list)

    def delay(self, attempt: int) -> float:
        # Exponential backoff, capped so a long outage doesn't stall the caller forever.
        return min(self.base_delay * 2**attempt, 8.0)


async def fetch_json(client, url: str, policy: RetryPolicy) -> dict:
    for attempt in range(policy.attempts):
        response = await client.get(url, timeout=10.0)
        if response.status_code not in policy.retry_on:
            response.raise_for_status()
            return json.loads(response.text)
        wait = policy.delay(attempt)
        policy.history.append(wait)
        await asyncio.sleep(wait)
    raise RuntimeError(f"{url}: gave up after {policy.attempts} attempts")


def summarize(rows: list[dict]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row in rows:
        key = row.get("status", "unknown").lower()
        totals[key] = totals.get(key, 0) + int(row.get("count", 1))
    return dict(sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])))

{"id": "g-20931", "goal": "Migrate the billing service to Postgres 16", "todos": [
  {"id": "t-1", "name": "dump the staging database", "goal_id": "g-20931", "done": true},
  {"id": "t-2", "name": "run pg_upgrade --check on a copy", "goal_id": "g-20931", "done": false},
  {"id": "t-3", "name": "update DATABASE_URL in deploy/values.yaml", "goal_id": null, "done": false}
], "updated_at": "2024-11-02T14:07:55Z", "owner": {"name": "ops-bot", "retries": 2}}

$ git log --oneline -n 4 && ls -la src/
a91f3c2 Fix off-by-one in pagination cursor
7d20b9e Add retry policy to the HTTP client
4c8e1aa Bump httpx to 0.27.2
0e5d7f1 Initial import
total 48
drwxr-xr-x  4 dev dev  4096 Nov  2 14:01 .
-rw-r--r--  1 dev dev  2210 Nov  2 13:58 client.py
-rw-r--r--  1 dev dev   913 Nov  2 13:40 __init__.py
for (let i = 0; i < items.length; i++) { if (items[i].price > max) { max = items[i].price; } }
SELECT user_id, COUNT(*) AS n FROM orders WHERE created_at >= '2024-01-01' GROUP BY 1;
'''

KOREAN = """\
북쪽 곶에 있던 등대가 봄에 불을 껐다. 거의 백 년 동안 일해 온 등대였다. 마을 사람들 가운데
그 느린 하얀 불빛이 바다를 쓸고 지나가지 않는 겨울을 기억하는 사람은 아무도 없었다. 몇 주
동안 사람들은 마치 등대가 잠에서 깨는 것을 잊어버린 것처럼 어두운 탑을 자꾸 돌아보았다.

이제 배들은 등대가 필요하지 않다. 위성 항법 장치가 선장에게 몇 미터 단위로 위치를 알려 주고,
화면 속 해도는 밤마다 저절로 새로 고쳐진다. 항구 관리인은 학교 강당에서 열린 회의에서 이
이야기를 여러 번 차분하게 설명했지만, 나이 든 어부들은 고개를 저었다. 그들이 반대한 이유는
사실 안전 때문이 아니었다. 저녁마다 방파제를 따라 집으로 걸어가며 머리 위로 지나가는 불빛을
세던 기억, 그리고 그 불빛 덕분에 얼마나 걸어왔는지 알 수 있었던 그 느낌 때문이었다.

오늘 회의에서는 다음 분기 예산을 다시 검토하고, 고객 지원 팀의 인력 배치를 조정하기로 했다.
새로운 결제 시스템은 다음 달 첫째 주에 시험 운영을 시작하며, 문제가 없으면 셋째 주부터 모든
사용자에게 공개된다. 담당자는 각 단계가 끝날 때마다 결과를 정리해서 공유해 주기 바란다.

서울의 겨울은 생각보다 건조하고 춥다. 아침 출근길에는 따뜻한 커피 한 잔이 큰 위로가 되고,
퇴근길 지하철 안에서는 다들 휴대 전화를 보며 조용히 하루를 마무리한다. 주말이 되면 가까운
산에 오르거나 시장에 들러 제철 음식을 사는 사람들이 많다. 작은 식당에서 먹는 뜨거운 국밥
한 그릇은 추위를 잊게 해 준다.

사용자가 요청한 작업은 세 가지이다. 첫째, 지난 석 달 동안의 주문 기록을 정리한다. 둘째,
환불 요청이 많은 상품을 찾아 원인을 분석한다. 셋째, 분석 결과를 바탕으로 다음 분기 개선
계획을 세운다. 각 작업은 순서대로 진행하고, 중간 결과는 반드시 기록해 두어야 한다.
"""

CORPORA: dict[str, str] = {"english": ENGLISH_PROSE, "code": CODE, "korean": KOREAN}
