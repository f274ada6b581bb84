# frozen_string_literal: true

require "spec_helper"
require "fileutils"
require "net/http"
require "tmpdir"
require "uri"
require_relative "../support/web_records"

# The page as a person uses it: a real Rack server process (WEBrick) serving Sidekiq Web
# with the Idempotency tab, seeded records in a database of its own, and Debian's
# headless Chromium driven by selenium-webdriver: load the tab, click "Resolve as done",
# confirm, and check the record changed. Saves tmp/web-ui.png (and docs/web-ui.png, the
# README's picture, with UPDATE_SCREENSHOT=1).
RSpec.describe "The operators' page in a browser", :browser do
  def self.chromium = %w[/usr/bin/chromium /usr/bin/chromium-browser].find { |p| File.executable?(p) }
  def self.chromedriver = %w[/usr/bin/chromedriver /usr/lib/chromium/chromedriver].find { |p| File.executable?(p) }

  before(:all) do
    skip "Chromium and chromedriver are not installed (bin/setup installs Debian's chromium and chromium-driver)" unless
      self.class.chromium && self.class.chromedriver
    require "selenium-webdriver"
  end

  let(:root) { File.expand_path("../..", __dir__) }

  let(:database_url) do
    URI(SpecServices.database_url).tap { |u| u.path = "/idempotent_job_browser" }.to_s
  end

  def fresh_database!
    admin = PG.connect(SpecServices.database_url)
    admin.set_notice_processor { |_| nil }
    admin.exec("DROP DATABASE IF EXISTS idempotent_job_browser WITH (FORCE)")
    admin.exec("CREATE DATABASE idempotent_job_browser")
  ensure
    admin&.close
  end

  # Starts the server process; returns its pid and port once it answers.
  def start_server
    FileUtils.mkdir_p(File.join(root, "tmp"))
    log = File.join(root, "tmp", "web-server.log")
    port_file = File.join(root, "tmp", "web-server.port")
    FileUtils.rm_f(port_file)
    pid = Process.spawn({ "DATABASE_URL" => database_url, "REDIS_URL" => ENV.fetch("REDIS_URL") },
                        RbConfig.ruby, File.join(root, "spec/support/web_server.rb"), port_file, out: log, err: log)
    deadline = Time.now + 30
    begin
      port = Integer(File.read(port_file))
      Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/idempotency/"))
      [pid, port]
    rescue SystemCallError, ArgumentError
      raise "the web server did not start (see #{log})" if Time.now > deadline || Process.wait(pid, Process::WNOHANG)

      sleep 0.1
      retry
    end
  end

  # Held and given-up operations as a stale-claim policy leaves them: a claim whose
  # worker died, taken over by a later delivery, then held (or given up).
  def seed!
    stopped = { %w[ChargeOrderJob 1042] => :hold, %w[ChargeOrderJob 1043] => :hold,
                %w[RefundPaymentJob 77:EUR] => :hold, %w[SendInvoiceJob inv-2026-118] => :give_up }
    stopped.each_key do |type, key|
      RecordRows.claim({ job_type: type, operation_key: key, jid: SecureRandom.hex(12), lease: 0.05,
                         job_class: type, queue: "default", args_json: JSON.generate([key]) })
    end
    sleep 0.12
    stopped.each do |(type, key), as|
      taken = RecordRows.claim({ job_type: type, operation_key: key, jid: SecureRandom.hex(12), lease: 30.0,
                                 job_class: type, queue: "default", args_json: JSON.generate([key]) })
      RecordRows.fenced(as, type, key, taken[:token])
    end
    web_repeated("ChargeOrderJob", "1001", repeats: 3)
  end

  # Waits for `text` on the page; a click starts a navigation, so the body read may be
  # the old page's, gone by the time its text is asked for (a stale element): read again.
  def wait_for(driver, text)
    errors = Selenium::WebDriver::Error
    Selenium::WebDriver::Wait.new(timeout: 20, ignore: [errors::NoSuchElementError, errors::StaleElementReferenceError])
                             .until { driver.find_element(tag_name: "body").text.include?(text) }
  end

  it "resolves a held operation from the Sidekiq Web tab: click, confirm, and the record is completed" do
    fresh_database!
    SpecServices.configure_gem!
    IdempotentJob.configure(database_url:)
    IdempotentJob.migrate!
    seed!
    server, port = start_server
    profile = Dir.mktmpdir("chromium-profile")
    options = Selenium::WebDriver::Chrome::Options.new(
      args: %W[--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
               --disable-sync --no-first-run --disable-dev-shm-usage --window-size=1280,960 --user-data-dir=#{profile}]
    )
    options.binary = self.class.chromium
    service = Selenium::WebDriver::Service.chrome(path: self.class.chromedriver)
    driver = Selenium::WebDriver.for(:chrome, options:, service:)

    driver.navigate.to("http://127.0.0.1:#{port}/sidekiq/idempotency")
    wait_for(driver, "Held and given-up operations")
    expect(driver.find_element(css: "li.active a").text).to eq("Idempotency")
    expect(driver.find_elements(css: "table.ij-table tbody tr").size).to eq(4)
    driver.save_screenshot(File.join(root, "tmp", "web-ui.png"))
    driver.save_screenshot(File.join(root, "docs", "web-ui.png")) if ENV["UPDATE_SCREENSHOT"] == "1"

    row = driver.find_element(xpath: "//tr[td/a[normalize-space()='1042']]")
    row.find_element(link_text: "Resolve as done").click
    wait_for(driver, "Resolve ChargeOrderJob operation 1042 as done?")
    expect(IdempotentJob.record("ChargeOrderJob", "1042").status).to eq(:held)
    driver.find_element(xpath: "//button[normalize-space()='Yes, resolve as done']").click
    wait_for(driver, "Resolved as done")

    expect(IdempotentJob.record("ChargeOrderJob", "1042")).to have_attributes(status: :completed, resolution: "done")
    expect(IdempotentJob.record("ChargeOrderJob", "1043").status).to eq(:held)
    expect(driver.current_url).to include("/sidekiq/idempotency/record?job_type=ChargeOrderJob&operation_key=1042")

    driver.navigate.to("http://127.0.0.1:#{port}/idempotency/repeats")
    wait_for(driver, "By job type")
    expect(driver.find_element(css: "svg.ij-chart").displayed?).to be(true)
  ensure
    driver&.quit
    if server
      Process.kill("TERM", server)
      Process.wait(server)
    end
    FileUtils.rm_rf(profile) if profile
    SpecServices.configure_gem!
  end
end
