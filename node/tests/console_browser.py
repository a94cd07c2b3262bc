"""Drives the web console in headless Chromium (Playwright) against a running gateway
and provider, as a user would: a playground prompt streamed with its provider, the
job's route, the network's providers, the provider's earnings. Saves a screenshot of
each page.

Then a failover: a long answer whose provider (CHEAP_PID, CHEAP_HTTP) is killed with
SIGKILL mid-stream finishes on the other provider (PROVIDER_HTTP), the route shows both
and the job page the failover; the other provider's page shows its earnings grew; and a
request over the gateway's daily budget shows the 402's reason.

The gateway asks for API keys: the browser signs in with ADMIN_KEY; a request made with
ALICE_KEY shows in alice's row of the keys table; alice's own key sees only alice. The
provider's page shows its policy in force; the network page adverts as they arrive.

Usage: python3 console_browser.py GATEWAY_HTTP PROVIDER_HTTP SCREENSHOT_DIR CHEAP_PID ADMIN_KEY ALICE_KEY
Prints one JSON object; exits non-zero (with Playwright's message) on a failed check.
"""
import json
import os
import signal
import sys
import urllib.request

from playwright.sync_api import expect, sync_playwright

gateway, provider, shots, cheap_pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
admin_key, alice_key = sys.argv[5], sys.argv[6]


def call(path, key, body=None):
    request = urllib.request.Request(f"http://{gateway}{path}", headers={"authorization": f"Bearer {key}"},
                                     data=json.dumps(body).encode() if body else None)
    if body:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


# alice spends a little with her own key; her key sees only itself, the admin's sees all.
answer = call("/v1/chat/completions", alice_key, {"model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": "Say hi."}]})
assert answer["choices"][0]["message"]["content"], answer
assert [k["name"] for k in call("/v1/account/keys", alice_key)["keys"]] == ["alice"]
assert sorted(k["name"] for k in call("/v1/account/keys", admin_key)["keys"]) == ["alice", "ops"]
assert list(call("/v1/account/spend", alice_key)["per_api_key"]) == [k["id"] for k in call("/v1/account/keys", alice_key)["keys"]]
# Spend against budgets in the metrics too: the gateway's limit, alice's spend today.
metrics = urllib.request.urlopen(urllib.request.Request(f"http://{gateway}/metrics",
                                 headers={"authorization": f"Bearer {admin_key}"}), timeout=30).read().decode()
assert 'sharemesh_gateway_budget_limit_nano_usd{budget="gateway\'s daily"} 100000' in metrics, metrics
alice_spent = [l for l in metrics.splitlines() if l.startswith('sharemesh_gateway_budget_spent_nano_usd{budget="API key alice\'s daily"}')]
assert alice_spent and int(alice_spent[0].split()[-1]) > 0, metrics
ANSWER = "The answer is 4."
expect.set_options(timeout=60_000)

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                args=["--no-sandbox", "--disable-gpu"])
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))

    # The gateway asks for a key: sign in with the admin's.
    page.goto(f"http://{gateway}/#playground")
    expect(page.locator("#keybox")).to_be_visible()
    page.fill("#key", admin_key)
    page.click("#savekey")

    # Playground: a prompt streams back with the provider that served it.
    page.goto(f"http://{gateway}/#playground")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "16")
    page.fill("#prompt", "What is 2 + 2?")
    page.click("#send")
    expect(page.locator('[data-role="answer"]').first).to_have_text(ANSWER)
    route = page.locator('[data-role="route"]').first
    expect(route).to_contain_text("served by")
    expect(route).to_contain_text("12D3KooW")
    expect(route).to_contain_text("tokens")
    page.screenshot(path=f"{shots}/playground.png", full_page=True)

    # The job's route and price per hop.
    route.locator("a").click()
    expect(page.locator("#segments")).to_contain_text("completed")
    expect(page.locator('[data-kpi="Jobs"]')).not_to_have_text("0")
    expect(page.locator("#budgets")).to_contain_text("gateway's daily")
    expect(page.locator("#budgets")).to_contain_text("$0.000100")
    # Every key with what it spent today against its budget: alice's request shows.
    expect(page.locator("#keys")).to_contain_text("ops")
    expect(page.locator('[data-key="alice"] td').nth(3)).not_to_have_text("$0.000000")
    expect(page.locator('[data-key="alice"] td').nth(4)).to_have_text("$0.000050")
    page.screenshot(path=f"{shots}/buyer.png", full_page=True)

    # The network: the provider with its model.
    page.goto(f"http://{gateway}/#network")
    expect(page.locator("#providers")).to_contain_text("smollm2-135m-instruct")
    # A gateway started without flags checks providers' work, and says so.
    expect(page.locator("#verification")).to_have_text("verification: outsourced")
    # Adverts as they arrive: a newer one than the first shown appears by itself.
    expect(page.locator("#adverts")).to_contain_text("accepted")
    first = int(page.locator("#adverts tr:nth-child(2) td").first.inner_text())
    page.wait_for_function(f"Number(document.querySelector('#adverts tr:nth-child(2) td').textContent) > {first}",
                           timeout=30_000)
    page.screenshot(path=f"{shots}/network.png", full_page=True)

    # The other provider's console before the failover: what it earned so far.
    page.goto(f"http://{provider}/#provider")
    expect(page.locator("#load")).to_contain_text("Mesh peers")
    # Its policy in force, as started.
    expect(page.locator("#policy-state")).to_have_text("taking new work")
    expect(page.locator('[data-policy="Availability"]')).to_have_text("mon-sun 00:00-24:00")
    expect(page.locator('[data-policy="Prices"]')).to_have_text("on_demand $0.100/Mtok")
    expect(page.locator('[data-policy="Buyers"]')).to_contain_text("≤ 3 at once each")
    earned_before = page.locator('[data-kpi="Earned"]').inner_text() if page.locator('[data-kpi="Earned"]').count() else "$0"

    # A failover: the serving provider is killed mid-answer; the answer completes.
    page.goto(f"http://{gateway}/#playground")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    page.click("#reset")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "120")
    page.fill("#prompt", "Write a long story about a dragon.")
    page.click("#send")
    answer = page.locator('[data-role="answer"]').first
    page.wait_for_function("document.querySelector('[data-role=answer]').textContent.length > 30", timeout=60_000)
    os.kill(cheap_pid, signal.SIGKILL)
    route = page.locator('[data-role="route"]').first
    expect(route).to_contain_text("failed over:", timeout=90_000)
    expect(route.locator(".hop")).to_have_count(2)
    # The failover point: the first hop's tokens and why it ended.
    expect(route.locator(".hop").first).to_contain_text("failover:")
    expect(route.locator(".hop").nth(1)).to_contain_text("completed")
    page.screenshot(path=f"{shots}/failover.png", full_page=True)
    route.locator("a").click()
    expect(page.locator("#segments")).to_contain_text("failover:")
    expect(page.locator("#segments")).to_contain_text("completed")

    # The provider that finished it earned more.
    page.goto(f"http://{provider}/#provider")
    expect(page.locator('[data-kpi="Earned"]')).not_to_have_text(earned_before)
    expect(page.locator('[data-kpi="Earned"]')).not_to_have_text("$0.000000")
    expect(page.locator("#load")).to_contain_text("Tokens served")
    # The jobs it served, the failover's second half among them, with what each paid.
    expect(page.locator("#served")).to_contain_text("smollm2-135m-instruct")
    expect(page.locator("#served tr:nth-child(2) td").nth(6)).not_to_have_text("$0.000000")
    page.screenshot(path=f"{shots}/provider.png", full_page=True)

    # Over the daily budget: the 402's reason, in the playground.
    page.goto(f"http://{gateway}/#playground")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    page.click("#reset")
    page.fill("#max_tokens", "4000")
    page.fill("#prompt", "Write a very long story about a dragon.")
    page.click("#send")
    expect(page.locator('[data-role="route"]').first).to_contain_text("budget")
    page.screenshot(path=f"{shots}/over-budget.png", full_page=True)

    browser.close()
    if errors:
        print(json.dumps({"failed": "page errors", "errors": errors}))
        sys.exit(1)
print(json.dumps({"ok": True, "screenshots": sorted(os.listdir(shots))}))
