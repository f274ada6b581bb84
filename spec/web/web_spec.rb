# frozen_string_literal: true

require "spec_helper"
require "rack/test"
require "rack/session/cookie"
require "csv"
require "cgi"
require "idempotent_job/web"
require_relative "../support/web_records"

# The standalone page as a browser uses it: mounted under /idempotency behind a cookie
# session, every route through Rack::Test against the real PostgreSQL.
RSpec.describe IdempotentJob::Web do
  include Rack::Test::Methods

  let(:job_type) { web_job_type }

  def app
    @app ||= Rack::Builder.new do
      use Rack::Session::Cookie, secret: "s" * 64, key: "spec.session"
      map("/idempotency") { run IdempotentJob::Web }
    end
  end

  # The CSRF token of the confirmation page's form (the session's token).
  def confirm_token(key, as: "done")
    get "/idempotency/confirm", job_type:, operation_key: key, as: as
    expect(last_response.status).to eq(200)
    last_response.body[/name="authenticity_token" value="([^"]+)"/, 1] or raise "no CSRF field on the page"
  end

  def resolve(key, as:, token:, **extra)
    post "/idempotency/resolve", { job_type:, operation_key: key, as:, "authenticity_token" => token, **extra }
  end

  describe "the held and given-up page" do
    it "lists held and given-up operations with their buttons, narrowed by job type" do
      web_stopped(job_type, "7", as: :hold)
      web_stopped(job_type, "8", as: :give_up)
      web_claim(job_type, "9")
      get "/idempotency/", job_type: job_type

      expect(last_response.status).to eq(200)
      body = last_response.body
      held, given_up = body.split("<h2>Given up")
      expect(held).to include("Held <span class=\"ij-count\">(1)", ">7</a>", "jid-7", "WebSpecJob on critical")
      expect(given_up).to include("(1)", ">8</a>")
      expect(body).not_to include(">9</a>")
      expect(body).to include(%(href="/idempotency/confirm?job_type=#{job_type}&amp;operation_key=7&amp;as=done"))
      expect(body).to include(">Rerun</a>", "<!DOCTYPE html>", "<style>")
      expect(body).not_to match(/<(script|link)\b/)
      expect(body).not_to include("Read-only")
    end

    # Issue 34 item 1: the page and the held event say why the reclaim budget held it.
    it "shows why the reclaim budget held an operation, as the held event says it" do
      web_stale(job_type, "5")
      reasons = []
      handle = IdempotentJob.subscribe(:held) { |_, payload| reasons << payload[:reason] }
      begin
        expect(IdempotentJob.perform_once(job_type, "5", max_takeovers: 0) { raise "ran" }.decision).to eq(:held)
      ensure
        IdempotentJob.unsubscribe(handle)
      end
      why = "the reclaim budget is spent: 1 stale takeover of this operation, max_takeovers 0"
      expect(reasons).to eq([why])
      get "/idempotency/", job_type: job_type
      held, = last_response.body.split("<h2>Given up")
      expect(held).to include("Held <span class=\"ij-count\">(1)", ">5</a>", why)
    end

    it "says when nothing is held" do
      get "/idempotency", job_type: "NoSuchJob"
      expect(last_response.body).to include("No held operations.", "No given-up operations.")
    end
  end

  describe "a record's stored result" do
    it "shows the stored result, why one was not stored, or that none was asked for" do
      IdempotentJob.perform_once(job_type, "r1", store_result: true) { { "charge_id" => "ch_<1>" } }
      IdempotentJob.perform_once(job_type, "r2", store_result: true) { Time.now }
      IdempotentJob.perform_once(job_type, "r3") { "not stored" }
      shown = %w[r1 r2 r3].map do |key|
        get "/idempotency/record", job_type:, operation_key: key
        expect(last_response.status).to eq(200)
        last_response.body[%r{<dt>Stored result</dt><dd[^>]*>([^<]*)</dd>}, 1]
      end
      expect(shown).to eq(["{&quot;charge_id&quot;:&quot;ch_&lt;1&gt;&quot;}", "not stored: not a JSON value",
                           "— (none: no store_result)"])
    end

    # A record's arguments and result may nest as deep as the core accepts
    # (Native::MAX_NESTING levels, e.g. from a Python producer); Ruby's JSON.generate stops
    # at 100 by default, which raised JSON::NestingError out of the page (a 500).
    it "shows arguments and a result nested as deep as the core accepts" do
      levels = IdempotentJob::Native::MAX_NESTING
      deep = 1
      levels.times { deep = [deep] } # [[…[1]…]]: `levels` arrays
      text = "#{"[" * levels}1#{"]" * levels}"
      IdempotentJob.perform_once(job_type, "result", store_result: true) { deep }
      # A stale claim taken over stores its job (the arguments the page shows).
      2.times do |i|
        RecordRows.claim({ job_type:, operation_key: "args", jid: "jid-#{i}", lease: i.zero? ? 0.05 : 30.0,
                           job_class: "WebSpecJob", queue: "critical", args_json: text, args_digest: "d-deep" })
        sleep 0.12 if i.zero?
      end
      shown = %w[result args].map do |key|
        get "/idempotency/record", job_type:, operation_key: key
        expect(last_response.status).to eq(200), last_response.body[0, 300]
        last_response.body
      end
      expect(shown[0][%r{<dt>Stored result</dt><dd[^>]*>([^<]*)</dd>}, 1]).to eq(text)
      expect(shown[1][%r{<dt>Arguments</dt><dd[^>]*>([^<]*)</dd>}, 1]).to eq(text)
    end
  end

  describe "resolving" do
    # A resolve the server answers with an error is not the record refusing it (409): a
    # bug (XX000 here, from a trigger) is raised to the host app's error tracker as on
    # every other page, a database that cannot be written (25006: a read-only standby) is
    # the pages' 503 (docs/web.md).
    it "raises a server error of the resolve (XX000) and answers a read-only database (25006) with a 503, " \
       "never a 409" do
      web_stopped(job_type, "7")
      token = confirm_token("7")
      db = Effects.connection
      db.exec(<<~SQL)
        CREATE OR REPLACE FUNCTION ij_resolve_boom() RETURNS trigger LANGUAGE plpgsql AS
          $$BEGIN RAISE EXCEPTION 'ij_resolve_boom: internal failure' USING ERRCODE = 'XX000'; END$$;
      SQL
      db.exec(<<~SQL)
        CREATE TRIGGER ij_resolve_boom BEFORE UPDATE ON idempotent_job_records FOR EACH ROW
          WHEN (OLD.job_type = '#{job_type}') EXECUTE FUNCTION ij_resolve_boom()
      SQL
      begin
        expect { resolve("7", as: "done", token:) }
          .to raise_error(IdempotentJob::DatabaseError, /ij_resolve_boom/) { |e| expect(e.sqlstate).to eq("XX000") }
      ensure
        db.exec("DROP TRIGGER IF EXISTS ij_resolve_boom ON idempotent_job_records")
      end

      url = "#{SpecServices.database_url}#{SpecServices.database_url.include?("?") ? "&" : "?"}" \
            "options=-c%20default_transaction_read_only%3Don"
      SpecServices.configure_gem!(database_url: url)
      resolve("7", as: "done", token:)
      expect(last_response.status).to eq(503), "#{last_response.status} #{last_response.body[0, 400]}"
      expect(last_response.body).to include("SQLSTATE 25006")
      SpecServices.configure_gem!
      expect(IdempotentJob.record(job_type, "7").status).to eq(:held)
    end

    it "asks for confirmation, then resolves as done on a POST with the session's token" do
      web_stopped(job_type, "7")
      token = confirm_token("7")
      expect(last_response.body).to include("Resolve #{job_type} operation", "Yes, resolve as done",
                                            %(action="/idempotency/resolve"))
      expect(IdempotentJob.record(job_type, "7").status).to eq(:held)

      resolve("7", as: "done", token:)
      expect(last_response.status).to eq(302)
      expect(last_response.location).to eq("/idempotency/record?job_type=#{job_type}&operation_key=7&resolved=done")
      expect(IdempotentJob.record(job_type, "7")).to have_attributes(status: :completed, resolution: "done")

      follow_redirect!
      expect(last_response.body).to include("Resolved as done", "ij-status ij-completed")
    end

    it "reruns: releases the record and enqueues the stored job" do
      web_stopped(job_type, "8", as: :give_up)
      resolve("8", as: "rerun", token: confirm_token("8", as: "rerun"))

      expect(last_response.status).to eq(302)
      expect(IdempotentJob.record(job_type, "8")).to have_attributes(status: :released, resolution: "rerun")
      pushed = Sidekiq::Queues["critical"].last
      expect(pushed).to include("class" => "WebSpecJob", "args" => ["8"])
    end

    # A record held by hand (no takeover stored its job): the core refuses the rerun, and the
    # page says why (409), as for any resolve it cannot make, instead of failing with a 500.
    it "refuses (409) a rerun of a record with no stored job, naming the operation; it stays held" do
      first = web_claim(job_type, "6")
      RecordRows.fenced(:hold, job_type, "6", first[:token])
      expect(IdempotentJob.record(job_type, "6")).to have_attributes(status: :held, job_class: nil, args: nil)
      get "/idempotency/", job_type: job_type
      expect(last_response.body).to include("jid-6", "no stored job")
      expect(last_response.body).not_to include(" on default")
      token = confirm_token("6", as: "rerun")
      expect(last_response.body).to include("holds no stored job", "a rerun will be refused")
      expect(last_response.body).not_to include("is enqueued again")
      resolve("6", as: "rerun", token:)

      expect(last_response.status).to eq(409)
      expect(CGI.unescapeHTML(last_response.body)).to include(
        "Not resolved: cannot rerun #{job_type} operation \"6\"", "holds no stored job"
      )
      expect(IdempotentJob.record(job_type, "6")).to have_attributes(status: :held, resolution: nil)
    end

    it "refuses a POST without the token, with another token, or without a session (403), changing nothing" do
      web_stopped(job_type, "7")
      confirm_token("7")
      resolve("7", as: "done", token: nil)
      expect(last_response.status).to eq(403)
      expect(last_response.body).to include("CSRF token is missing or does not match")
      resolve("7", as: "done", token: "x" * 43)
      expect(last_response.status).to eq(403)

      bare = Rack::MockRequest.new(IdempotentJob::Web)
      response = bare.post("/resolve", params: { job_type:, operation_key: "7", as: "done", authenticity_token: "x" })
      expect(response.status).to eq(403)
      expect(response.body).to include("no Rack session")
      expect(bare.get("/", params: { job_type: }).body).to include("Read-only: there is no Rack session")
      expect(IdempotentJob.record(job_type, "7").status).to eq(:held)
    end

    it "refuses (409) a resolve of a record that is no longer held, or changed since the form was shown" do
      web_stopped(job_type, "7")
      token = confirm_token("7")
      shown = IdempotentJob.record(job_type, "7").claim_token
      IdempotentJob.resolve(job_type, "7", as: :rerun) # someone else, meanwhile
      resolve("7", as: "done", token:, claim_token: shown)
      expect(last_response.status).to eq(409)
      expect(last_response.body).to include("Not resolved: it is released now, not held or given up.")

      decision = web_claim(job_type, "7") # the rerun's delivery claims, and is held again
      RecordRows.fenced(:hold, job_type, "7", decision[:token])
      resolve("7", as: "done", token:, claim_token: shown)
      expect(last_response.status).to eq(409)
      expect(last_response.body).to include("it changed since the confirmation page was shown")
      expect(IdempotentJob.record(job_type, "7").status).to eq(:held)

      get "/idempotency/confirm", job_type:, operation_key: "404", as: "done"
      expect(last_response.status).to eq(404)
      web_claim(job_type, "5")
      get "/idempotency/confirm", job_type:, operation_key: "5", as: "done"
      expect(last_response.status).to eq(409)
      get "/idempotency/confirm", job_type:, operation_key: "7", as: "delete"
      expect(last_response.status).to eq(400)
      expect(last_response.body).to include("as= must be one of done, rerun")
    end

    it "settles a held operation once while deliveries of it race the resolve (real threads)" do
      web_stopped(job_type, "7")
      token = confirm_token("7", as: "rerun")
      shown = IdempotentJob.record(job_type, "7").claim_token
      resolved = false
      turned_away = Queue.new
      deliveries = Array.new(6) do |i|
        Thread.new do
          decisions = []
          after = 0
          # Deliver until three deliveries have come after the resolve finished.
          while after < 3
            after += 1 if resolved
            decisions << web_claim(job_type, "7", jid: "racer-#{i}")[:decision]
            turned_away << true if decisions.last == :held
          end
          decisions
        end
      end
      turned_away.pop # deliveries are arriving: resolve now
      resolve("7", as: "rerun", token:, claim_token: shown)
      resolved = true
      decisions = deliveries.flat_map(&:value)

      expect(last_response.status).to eq(302)
      expect(decisions.count(:claimed)).to eq(1)
      expect(decisions.uniq - %i[claimed held in_progress]).to eq([])
      expect(decisions).to include(:held, :in_progress)
      record = IdempotentJob.record(job_type, "7")
      # Attempts: the first claim, the takeover that held it (web_stopped), the rerun's retry.
      expect(record).to have_attributes(status: :claimed, last_claim: :retry, attempts: 3, resolution: "rerun")
      expect(record.jid).to start_with("racer-")
    end

    it "lets one of two people resolving at once win and tells the other (real threads)" do
      web_stopped(job_type, "8")
      token = confirm_token("8")
      cookie = rack_mock_session.cookie_jar.for(URI("http://example.org/idempotency/resolve"))
      statuses = Array.new(2) do
        Thread.new do
          Rack::MockRequest.new(app).post("/idempotency/resolve", "HTTP_COOKIE" => cookie,
                                                                  params: { job_type:, operation_key: "8", as: "done",
                                                                            authenticity_token: token }).status
        end
      end.map(&:value)
      expect(statuses.sort).to eq([302, 409])
      # Attempts: the first claim and the takeover that held it (web_stopped); resolving adds none.
      expect(IdempotentJob.record(job_type, "8")).to have_attributes(status: :completed, attempts: 2)
    end
  end

  describe "the record search and a record's page" do
    it "finds records of a job type by key prefix and status, and shows one record whole" do
      web_claim(job_type, "order-1")
      web_stopped(job_type, "order-2")
      web_claim(job_type, "refund-1")
      get "/idempotency/records", job_type:, operation_key: "order-"
      expect(last_response.body).to include("2 records", ">order-1</a>", ">order-2</a>")
      expect(last_response.body).not_to include(">refund-1</a>")
      get "/idempotency/records", job_type:, operation_key: "order-", status: "held"
      expect(last_response.body).to include("1 record,", ">order-2</a>")
      expect(last_response.body).to include(%(<option value="#{job_type}">))

      get "/idempotency/record", job_type:, operation_key: "order-2"
      expect(last_response.body).to include("ij-status ij-held", "jid-order-2", "[&quot;order-2&quot;]",
                                            "Resolve as done</a>")
      get "/idempotency/record", job_type:, operation_key: "order-1"
      expect(last_response.body).not_to include("Resolve as done</a>")
    end

    # Only a takeover of a stale claim stores the job (class, queue, arguments): a record no
    # delivery took over has none, and its page says so instead of "on default" and "null".
    it "shows the stored job of a record taken over, and says a record without one has none" do
      web_claim(job_type, "order-3")
      get "/idempotency/record", job_type:, operation_key: "order-3"
      body = last_response.body
      expect(body).to include("jid-order-3", "none stored")
      expect(body).not_to include(" on default", ">null<")

      web_stopped(job_type, "order-4")
      get "/idempotency/record", job_type:, operation_key: "order-4"
      expect(last_response.body).to include("WebSpecJob on critical", "[&quot;order-4&quot;]")
      expect(last_response.body).not_to include("none stored")
    end

    it "answers 404 for a record never claimed and 400 for a bad search" do
      get "/idempotency/record", job_type:, operation_key: "nope"
      expect(last_response.status).to eq(404)
      expect(last_response.body).to include("No record of #{job_type} operation &quot;nope&quot;")
      get "/idempotency/records", job_type:, status: "finished"
      expect(last_response.status).to eq(400)
      expect(last_response.body).to include("unknown record status")
      get "/idempotency/record", job_type: job_type
      expect(last_response.status).to eq(400)
      expect(last_response.body).to include("operation_key is required")
    end

    it "escapes what it shows" do
      web_stopped(job_type, "<script>alert(1)</script>")
      get "/idempotency/", job_type: job_type
      expect(last_response.body).to include("&lt;script&gt;alert(1)&lt;/script&gt;")
      expect(last_response.body).not_to include("<script>alert")
    end
  end

  describe "keys and parameters a careless or hostile request sends" do
    # Every key a record can have: only spaces, surrounding spaces, Unicode (NFD, full
    # width, CJK, emoji), and the longest allowed (2,000 bytes with the job type).
    def odd_keys
      [" ", "   ", " A1 ", "e\u0301 ＡＢ１ 漢字 😀", "ключ-#{"я" * ((2000 - job_type.bytesize - 9) / 2)}"]
    end

    it "opens and resolves a record whatever its key, from the links the page itself shows" do
      expect(odd_keys.map { |k| (job_type + k).bytesize }.max).to be > 1990
      odd_keys.each { |key| web_stopped(job_type, key) }
      get "/idempotency/records", job_type: job_type
      links = last_response.body.scan(%r{href="(/idempotency/record\?[^"]+)"}).flatten.map { |l| CGI.unescapeHTML(l) }
      expect(links.size).to eq(odd_keys.size)
      links.each do |link|
        get link
        expect(last_response.status).to eq(200), "#{link}: #{last_response.status}"
      end
      get "/idempotency/records", job_type: job_type, operation_key: " " # a prefix of one space
      expect(last_response.body.scan(%r{href="/idempotency/record\?}).size).to eq(3)

      odd_keys.each do |key|
        get "/idempotency/record", job_type:, operation_key: key
        expect(last_response.status).to eq(200)
        expect(last_response.body).to include("ij-status ij-held")
        resolve(key, as: "done", token: confirm_token(key))
        expect(last_response.status).to eq(302)
        follow_redirect!
        expect(last_response.body).to include("Resolved as done")
        expect(IdempotentJob.record(job_type, key)).to have_attributes(status: :completed, resolution: "done")
      end
      expect(IdempotentJob.record(job_type, "A1")).to be_nil
    end

    it "answers 400 with a message for a NUL byte or invalid UTF-8 in any parameter, never a 500" do
      key = "job_type=#{job_type}&operation_key=7"
      of = "job_type=#{job_type}&operation_key"
      {
        "/idempotency/record?#{of}=a%00b" => "parameter \"operation_key\" contains a NUL",
        "/idempotency/record?#{of}=%FF%FE" => "parameter \"operation_key\" is not valid UTF-8",
        "/idempotency/record?job_type=%C3%28&operation_key=7" => "parameter \"job_type\" is not valid UTF-8",
        "/idempotency/confirm?#{key}&as=done%00" => "parameter \"as\" contains a NUL",
        "/idempotency/records?job_type=#{job_type}&status=%E9" => "parameter \"status\" is not valid UTF-8",
        "/idempotency/?job_type=%00" => "parameter \"job_type\" contains a NUL",
        "/idempotency/repeats?hours=1%00" => "parameter \"hours\" contains a NUL",
        "/idempotency/repeats.csv?job_type=%FF" => "parameter \"job_type\" is not valid UTF-8",
        "/idempotency/takeovers?hours=%C0%80" => "parameter \"hours\" is not valid UTF-8",
        "/idempotency/record?#{key}&%FF=1" => "a parameter name is not valid UTF-8"
      }.each do |url, message|
        get url
        expect(last_response.status).to eq(400), "#{url}: #{last_response.status}"
        expect(CGI.unescapeHTML(last_response.body)).to include(message)
      end

      web_stopped(job_type, "7")
      token = confirm_token("7")
      post "/idempotency/resolve", "#{key}&as=done&authenticity_token=#{CGI.escape(token)}&claim_token=%00"
      expect(last_response.status).to eq(400)
      expect(CGI.unescapeHTML(last_response.body)).to include("parameter \"claim_token\" contains a NUL")
      expect(IdempotentJob.record(job_type, "7").status).to eq(:held)

      # A malformed %-escape, which Rack::Test refuses to send: the environment by hand.
      env = Rack::MockRequest.env_for("/idempotency/record").merge("QUERY_STRING" => "#{key}&x=%E")
      status, _headers, body = app.call(env)
      expect([status, body.join]).to match([400, /cannot be read: invalid %-encoding/])
    end
  end

  describe "the repeats report" do
    it "charts repeats over time per cause, classifies each, names producer pairs, shows its SQL" do
      web_repeated(job_type, "1", repeats: 3)
      web_repeated(job_type, "2", repeats: 1, again_by: "app/webhooks/stripe_webhook.rb:17")
      get "/idempotency/repeats", hours: "2", job_type: job_type

      body = last_response.body
      expect(last_response.status).to eq(200)
      # The chart: repeats over time, one series per cause.
      expect(body).to include("<svg class=\"ij-chart\"", "re-enqueue, same producer (3)",
                              "re-enqueue, other producer (1)", "4 repeats from")
      expect(body).to include(">1</a>", ">2</a>", "re-enqueue, same producer +0 s", "re-enqueue, other producer +0 s",
                              %(by <span class="ij-key">app/webhooks/stripe_webhook.rb:17</span>),
                              IdempotentJob.repeats_sql.strip.lines.first.strip)
      pairs = body[%r{Producers enqueuing the same operations.*?</table>}m]
      expect(pairs).to include("app/controllers/orders_controller.rb:42", "app/webhooks/stripe_webhook.rb:17",
                               %(<td class="ij-num">1</td>))
      expect(body.scan(%r{<td class="ij-num">(\d+)</td>}).flatten.first(2)).to eq(%w[2 4])
      get "/idempotency/repeats", hours: "0"
      expect(last_response.status).to eq(400)
    end

    it "exports the report as CSV, one row per repeat" do
      web_repeated(job_type, "1", repeats: 2)
      get "/idempotency/repeats.csv", hours: "1", job_type: job_type
      expect(last_response.status).to eq(200)
      expect(last_response.headers["content-type"]).to start_with("text/csv")
      expect(last_response.headers["content-disposition"])
        .to match(/attachment; filename="idempotent_job-repeats-.*\.csv"/)
      rows = CSV.parse(last_response.body, headers: true)
      expect(rows.map { |r| [r["operation_key"], r["cause"], r["delivery_id"]] })
        .to eq([["1", "re_enqueue_same_producer", "again-1-0"], ["1", "re_enqueue_same_producer", "again-1-1"]])
    end

    it "neutralises keys and producers a spreadsheet would run as formulas" do
      web_repeated(job_type, '=HYPERLINK("http://evil.example","x")', repeats: 1, again_by: "@SUM(1+1)")
      get "/idempotency/repeats.csv", hours: "1", job_type: job_type
      row = CSV.parse(last_response.body, headers: true).first
      expect(row.to_h).to include("operation_key" => %('=HYPERLINK("http://evil.example","x")),
                                  "producer" => "'@SUM(1+1)",
                                  "first_producer" => "app/controllers/orders_controller.rb:42")
    end
  end

  describe "takeovers and stale claims" do
    it "lists a recent takeover (a lost claim) and a stale claim not yet taken over" do
      web_stale(job_type, "taken", take_over: true)
      web_stale(job_type, "dying")
      get "/idempotency/takeovers", hours: "1"

      taken, stale = last_response.body.split("<h2>Stale claims now")
      expect(taken).to include(">taken</a>", "jid-taker", "lost claim")
      expect(taken).not_to include(">dying</a>")
      expect(stale).to include(">dying</a>", "jid-dead")
      expect(stale).not_to include(">taken</a>")
    end
  end

  it "answers 404 for an unknown page and 405 for a GET of the resolve action" do
    get "/idempotency/nowhere"
    expect(last_response.status).to eq(404)
    get "/idempotency/resolve"
    expect(last_response.status).to eq(405)
    expect(last_response.body).to include("/resolve only answers POST")
  end
end
