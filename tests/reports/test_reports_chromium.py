"""summary.html in a real headless Chromium: no console errors, the grid, the axis filter, failures that expand.

Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them) and selenium (the `test`
extra); without them these tests skip and say which is missing. The browser gets no network.
"""

from __future__ import annotations

import shutil

import pytest

from torchmatrix.reports.report import write_report

from helpers.report_runs import write_fixture_run, write_hostile_run

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
)

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="headless Chromium not installed: apt-get install chromium chromium-driver (.ci/run does)",
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed: pip install -e '.[test]'")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def open_page(browser, path):
    """Load the page; earlier pages' console messages are drained first, so each test sees only its own."""
    browser.get_log("browser")
    browser.get(path.as_uri())


def console_errors(browser) -> list[str]:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.fixture
def fixture_page(tmp_path):
    run_dir = write_fixture_run(tmp_path / "project")
    write_report(run_dir)
    return run_dir / "summary.html"


def visible_rows(browser):
    return [row for row in browser.find_elements("css selector", "tr.cell-row") if row.is_displayed()]


def test_the_page_loads_without_console_errors_and_shows_every_cell(browser, fixture_page):
    open_page(browser, fixture_page)
    assert console_errors(browser) == []
    assert len(visible_rows(browser)) == 4
    assert len(browser.find_elements("css selector", "#grid .mark")) == 4 * 2 * 2, "cells x versions x suites"
    assert browser.find_element("id", "shown").text == "4 of 4 cells shown"


def test_filtering_by_an_axis_value_hides_the_other_cells(browser, fixture_page):
    open_page(browser, fixture_page)
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("css selector", "select[data-axis='1']")).select_by_visible_text("fsdp2")
    assert [row.find_element("tag name", "th").text for row in visible_rows(browser)] == ["ws1-fsdp2", "ws2-fsdp2"]
    assert browser.find_element("id", "shown").text == "2 of 4 cells shown"
    Select(browser.find_element("css selector", "select[data-axis='1']")).select_by_visible_text("all")
    assert len(visible_rows(browser)) == 4
    assert console_errors(browser) == []


def test_a_failure_expands_to_its_full_text(browser, fixture_page):
    open_page(browser, fixture_page)
    section = next(s for s in browser.find_elements("css selector", "section.root-cause") if "assert 3 == 4" in s.text)
    failure = section.find_element("css selector", "details.failure")
    text = failure.find_element("tag name", "pre")
    assert not text.is_displayed()
    failure.find_element("tag name", "summary").click()
    assert failure.get_attribute("open") is not None and text.is_displayed()
    assert "assert 3 == 4" in text.text


def test_a_red_mark_in_the_grid_opens_its_failure(browser, fixture_page):
    open_page(browser, fixture_page)
    row = next(r for r in visible_rows(browser) if r.find_element("tag name", "th").text == "ws2-fsdp2")
    row.find_element("css selector", "a.mark.failed").click()
    opened = browser.find_elements("css selector", "details.failure[open]")
    assert len(opened) == 1 and "test_regress" in opened[0].text and "AssertionError" in opened[0].text
    assert console_errors(browser) == []


def test_hostile_text_is_shown_not_run(browser, tmp_path):
    page = write_hostile_run(tmp_path) / "summary.html"
    open_page(browser, page)
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is the check that no alert opened
    assert 'x<script>alert("pwned")</script>' in browser.find_element("tag name", "body").text
    assert len(browser.find_elements("tag name", "script")) == 1
    assert console_errors(browser) == []


def test_a_script_injected_into_the_page_is_blocked_and_reported(browser, fixture_page):
    """Defence in depth behind the escaping: the page's CSP allows only its own script, by hash."""
    page = fixture_page.read_text().replace("</body>", "<script>document.title = 'injected'</script></body>")
    fixture_page.write_text(page)
    open_page(browser, fixture_page)
    assert browser.title != "injected"
    assert any("Content Security Policy" in message for message in console_errors(browser))
