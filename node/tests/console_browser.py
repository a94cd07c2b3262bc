"""Drives the web console in headless Chromium (Playwright) against a running gateway
and provider, as a user would: a playground prompt streamed with its provider, the
job's route, the network's providers, the provider's earnings. Saves a screenshot of
each page.

Then a failover: a long answer whose provider (CHEAP_PID, CHEAP_HTTP) is killed with
SIGKILL mid-stream finishes on the other provider (PROVIDER_HTTP), the route shows both
and the job page the failover; the other provider's page shows its earnings grew; and a
request over the gateway's daily budget shows the 402's reason.

Usage: python3 console_browser.py GATEWAY_HTTP PROVIDER_HTTP SCREENSHOT_DIR CHEAP_PID
Prints one JSON object; exits non-zero (with Playwright's message) on a failed check.
"""
import json
import os
import signal
import sys

from playwright.sync_api import expect, sync_playwright

gateway, provider, shots, cheap_pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ANSWER = "The answer to this classic math problem is 4."
expect.set_options(timeout=60_000)

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                args=["--no-sandbox", "--disable-gpu"])
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))

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
    page.screenshot(path=f"{shots}/buyer.png", full_page=True)

    # The network: the provider with its model.
    page.goto(f"http://{gateway}/#network")
    expect(page.locator("#providers")).to_contain_text("smollm2-135m-instruct")
    page.screenshot(path=f"{shots}/network.png", full_page=True)

    # The other provider's console before the failover: what it earned so far.
    page.goto(f"http://{provider}/#provider")
    expect(page.locator("#load")).to_contain_text("Mesh peers")
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
    page.screenshot(path=f"{shots}/failover.png", full_page=True)
    route.locator("a").click()
    expect(page.locator("#segments")).to_contain_text("failover:")
    expect(page.locator("#segments")).to_contain_text("completed")

    # The provider that finished it earned more.
    page.goto(f"http://{provider}/#provider")
    expect(page.locator('[data-kpi="Earned"]')).not_to_have_text(earned_before)
    expect(page.locator('[data-kpi="Earned"]')).not_to_have_text("$0.000000")
    expect(page.locator("#load")).to_contain_text("Tokens served")
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
