"""Drives the web console in headless Chromium (Playwright) against a running gateway
and provider, as a user would: a playground prompt streamed with its provider, the
job's route, the network's providers, the provider's earnings. Saves a screenshot of
each page.

Usage: python3 console_browser.py GATEWAY_HTTP PROVIDER_HTTP SCREENSHOT_DIR
Prints one JSON object; exits non-zero (with Playwright's message) on a failed check.
"""
import json
import os
import sys

from playwright.sync_api import expect, sync_playwright

gateway, provider, shots = sys.argv[1], sys.argv[2], sys.argv[3]
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
    page.screenshot(path=f"{shots}/buyer.png", full_page=True)

    # The network: the provider with its model.
    page.goto(f"http://{gateway}/#network")
    expect(page.locator("#providers")).to_contain_text("smollm2-135m-instruct")
    page.screenshot(path=f"{shots}/network.png", full_page=True)

    # The provider's own console: what it earned and what it is doing.
    page.goto(f"http://{provider}/#provider")
    expect(page.locator('[data-kpi="Earned"]')).not_to_have_text("$0.000000")
    expect(page.locator("#load")).to_contain_text("Tokens served")
    page.screenshot(path=f"{shots}/provider.png", full_page=True)

    browser.close()
    if errors:
        print(json.dumps({"failed": "page errors", "errors": errors}))
        sys.exit(1)
print(json.dumps({"ok": True, "screenshots": sorted(os.listdir(shots))}))
