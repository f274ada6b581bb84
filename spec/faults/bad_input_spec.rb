# frozen_string_literal: true

require "spec_helper"

# Bad input a careless user gives (issue 25): each case names what it proves. The
# option names, kinds, allowed values and defaults are the core's table
# (crates/core/src/options/), so every door refuses the same things the same way.
RSpec.describe "Bad input", :faults do
  include ReplayHelpers

  # A Sidekiq job class named `name`, declared by the block (a real constant: messages
  # name the job by its class name, as in an app).
  def sidekiq_job(name, &)
    klass = Class.new do
      include Sidekiq::Job

      def perform(order_id, _cents)
        Effects.record("charge", order_id)
      end
    end
    stub_const(name, klass)
    klass.class_eval(&)
    klass
  end

  describe "a misspelled idempotency_* option in sidekiq_options (issue 25 item 2)" do
    it "fails where the class is declared, naming the job, the option, the nearest known one and the others" do
      expect do
        sidekiq_job("StailJob") { sidekiq_options idempotency_key: :order_id, idempotency_on_stail: :hold }
      end.to raise_error(IdempotentJob::ConfigurationError) { |error|
        expect(error.message).to start_with("StailJob: unknown option idempotency_on_stail (did you mean " \
                                            "idempotency_on_stale?); known options: idempotency_key, idempotency_scope")
        expect(error.message).to end_with("idempotency_store_result, idempotency_on_enqueue, idempotency_max_takeovers")
      }
    end

    it "fails for a misspelled key too (the job would otherwise run without any claim)" do
      expect { sidekiq_job("KeysJob") { sidekiq_options idempotency_keys: :order_id } }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /\AKeysJob: unknown option idempotency_keys \(did you mean idempotency_key\?\)/)
    end

    it "leaves Sidekiq's own options and a correct declaration alone" do
      job = sidekiq_job("FineJob") { sidekiq_options idempotency_key: :order_id, idempotency_on_stale: :hold, retry: 2 }
      expect(job.get_sidekiq_options).to include("idempotency_on_stale" => :hold, "retry" => 2)
    end

    it "refuses a payload key the gem writes itself (idempotency_deferrals) in a declaration" do
      expect { sidekiq_job("DeferralsJob") { sidekiq_options idempotency_key: 0, idempotency_deferrals: 3 } }
        .to raise_error(IdempotentJob::ConfigurationError, /DeferralsJob: unknown option idempotency_deferrals/)
    end
  end

  describe "an option value of the wrong type (issue 25 item 2)" do
    {
      { idempotency_heartbeat: "false" } => 'idempotency_heartbeat must be true or false, got "false"',
      { idempotency_on_stale: :hodl } => "idempotency_on_stale must be one of reclaim, hold, skip, got :hodl",
      { idempotency_on_mismatch: "warn" } => 'idempotency_on_mismatch must be one of log, raise, got "warn"',
      { idempotency_lease: "60" } => "idempotency_lease must be a positive number of seconds up to 315360000 " \
                                     '(ten years), got "60"',
      { idempotency_lease: 0.1 } => "idempotency_lease must be at least 0.25 s",
      { idempotency_max_run: -1 } => "idempotency_max_run must be a positive number of seconds",
      { idempotency_lock_timeout: 3_000_000 } => "idempotency_lock_timeout must be a positive number of seconds up " \
                                                 "to 2147483 (PostgreSQL's limit)",
      { idempotency_transaction: "yes" } => "idempotency_transaction must be true, false or one of native, " \
                                            'active_record, got "yes"',
      { idempotency_scope: "" } => "idempotency_scope must not be empty"
    }.each do |option, message|
      it "refuses #{option.inspect} where the class is declared" do
        expect { sidekiq_job("TypedJob") { sidekiq_options idempotency_key: :order_id, **option } }
          .to raise_error(IdempotentJob::ConfigurationError, /\ATypedJob: #{Regexp.escape(message)}/)
      end
    end

    it "refuses a lookup that is neither a method name nor a callable, at the first push" do
      job = sidekiq_job("LookupJob") { sidekiq_options idempotency_key: :order_id, idempotency_lookup: 42 }
      expect { job.perform_async(1, 1) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        "LookupJob: idempotency_lookup must be a method name (Symbol or String) or a callable, got 42")
    end

    it "refuses a malformed key declaration where the class is declared (OperationKeyError)" do
      expect { sidekiq_job("FloatKeyJob") { sidekiq_options idempotency_key: 1.5 } }
        .to raise_error(IdempotentJob::OperationKeyError, /\AFloatKeyJob: idempotency key 1.5 has a part of type Float/)
      expect { sidekiq_job("EmptyKeyJob") { sidekiq_options idempotency_key: ["order..id"] } }
        .to raise_error(IdempotentJob::OperationKeyError, /EmptyKeyJob: .* contains an empty name or path segment/)
      # perform is defined (sidekiq_job defines it first): parameter names are checked too
      expect { sidekiq_job("NoParamJob") { sidekiq_options idempotency_key: :order } }
        .to raise_error(IdempotentJob::OperationKeyError, /NoParamJob: idempotency key :order names parameter "order"/)
    end

    it "refuses the same in ActiveJob's idempotency declaration, with the option as ActiveJob spells it" do
      require "idempotent_job/active_job"
      job = Class.new(ActiveJob::Base) { include IdempotentJob::ActiveJob }
      stub_const("TypedActiveJob", job)
      expect { job.idempotency(key: 0, heartbeat: "false") }
        .to raise_error(IdempotentJob::ConfigurationError,
                        'TypedActiveJob: heartbeat must be true or false, got "false"')
      expect { job.idempotency(key: 0, on_stail: :hold) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /\ATypedActiveJob: unknown option on_stail \(did you mean on_stale\?\)/)
    end
  end

  describe "what a declaration checks, the same in both Ruby doors" do
    it "checks only the declared options: unset ones take the configured defaults at first use" do
      require "idempotent_job/active_job"
      sidekiq = Class.new do
        include Sidekiq::Job
        sidekiq_options idempotency_key: 0
      end
      # Declared before the class has a name (the job type's default) and before
      # `configure`: before, ActiveJob's declaration resolved every default here and
      # refused the unnamed class's empty job type; Sidekiq's never read a default.
      active_job = Class.new(ActiveJob::Base) { include IdempotentJob::ActiveJob }.tap { |job| job.idempotency(key: 0) }
      stub_const("LateSidekiqJob", sidekiq)
      stub_const("LateActiveJob", active_job)
      IdempotentJob.configure(lease: 45, on_stale: :hold)
      resolved = [IdempotentJob::Sidekiq::Options.resolve(sidekiq, { "args" => [1] }), active_job.idempotency_options]
      expect(resolved.map { |options| [options.scope, options.lease, options.on_stale] })
        .to eq([["LateSidekiqJob", 45, :hold], ["LateActiveJob", 45, :hold]])
    end
  end

  describe "an idempotency_* option in a payload pushed by name, checked by the server side (issue 29 item 3)" do
    it "fails the Sidekiq delivery into its retry, naming the option and the nearest one; nothing runs" do
      # Pushed by class name: the client middleware never sees a class, so only the
      # server side can refuse it (before: the stale policy's default ran the body).
      Sidekiq::Client.push("class" => "ChargeOrderJob", "args" => [42, 1], "idempotency_on_stail" => "hold")
      job = ChargeOrderJob.jobs.pop
      expect { deliver(job) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /\AChargeOrderJob: unknown option idempotency_on_stail \(did you mean idempotency_on_stale\?\)/)
      expect(Effects.count).to eq(0)
      expect(record("42")).to be_nil
      deliver(job.except("idempotency_on_stail")) # the control: the same payload without it runs
      expect(Effects.count).to eq(1)
    end

    it "fails a Sidekiq delivery whose idempotency_deferrals is no count, naming the job; nothing runs" do
      Sidekiq::Client.push("class" => "ChargeOrderJob", "args" => [42, 1])
      job = ChargeOrderJob.jobs.pop
      # 2.5 was taken as 2 and "0x1f" as 31 (Integer() reads a String's radix prefix)
      # " 5", "+5" and "1_0" were read by Integer() too: the core's count rule (Celery's, SQS's) takes digits only
      # "5\xFF": a producer's raw byte, which JSON.parse leaves in a String not valid UTF-8 (an
      # EncodingError before, not the count's words); "5\xFF".b a binary String.
      [2**40, -1, "abc", [1], 2.5, "0x1f", Float::INFINITY, " 5", "+5", "1_0", JSON.parse(%(["5\xFF"])).first,
       "5\xFF".b].each do |bad|
        expect { deliver(job.merge("idempotency_deferrals" => bad)) }
          .to raise_error(IdempotentJob::ConfigurationError,
                          /\AChargeOrderJob: the delivery's deferrals \(idempotency_deferrals\) must be a whole/)
      end
      expect(Effects.count).to eq(0)
      expect(record("42")).to be_nil
      deliver(job.merge("idempotency_deferrals" => 2)) # the control: a count runs
      expect(Effects.count).to eq(1)
      # A count written as text is read in decimal ("010" was octal: 8 deferrals).
      delivery = IdempotentJob::Delivery.new(job_type: "J", operation_key: "k", deferrals: "010")
      expect(delivery.deferrals).to eq(10)
    end

    it "fails an ActiveJob delivery when it is deserialized, before anything is claimed" do
      require_relative "../support/active_job_jobs"
      data = AjChargeOrderJob.new(42, 1).serialize
      expect { ActiveJob::Base.execute(data.merge("idempotency_on_stail" => "hold")) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /\AAjChargeOrderJob: unknown option idempotency_on_stail \(did you mean idempotency_on_stale/)
      expect { ActiveJob::Base.execute(data.merge("idempotency_on_stale" => "hold")) }
        .to raise_error(IdempotentJob::ConfigurationError, /idempotency_on_stale in a serialized job is not taken/)
      expect(Effects.count).to eq(0)
      expect(record("42", job_type: "AjChargeOrderJob")).to be_nil
    end
  end

  describe "a payload Ruby built itself, with values JSON cannot carry (the middleware called directly)" do
    it "fails with the ConfigurationError naming the job, not JSON::GeneratorError; nothing runs" do
      Sidekiq::Client.push("class" => "ChargeOrderJob", "args" => [42, 1])
      job = ChargeOrderJob.jobs.pop
      [{ "created_at" => Float::NAN }, { "enqueued_at" => Float::INFINITY, "args" => [42, "\xFF".b] }].each do |bad|
        expect { deliver(job.merge(bad)) }
          .to raise_error(IdempotentJob::ConfigurationError,
                          /\AChargeOrderJob: the (facts|payload) cannot be written as JSON/)
      end
      expect(Effects.count).to eq(0)
      expect(record("42")).to be_nil
    end

    # A binary (ASCII-8BIT) String with high bytes: json 2.6 (Ruby 3.1) refuses it when
    # they are not UTF-8, json 3 (Ruby 3.3) even when they are (JSON::GeneratorError). Such
    # a String is valid in its encoding, so the rewrite for Strings that are not missed it
    # and the refused delivery kept no copy ("no copy is kept … JSON::GeneratorError").
    it "dead-letters a refusal whose arguments hold binary Strings with high bytes, each as its Base64 bytes" do
      Sidekiq::DeadSet.new.clear
      Sidekiq::Client.push("class" => "ChargeOrderJob", "args" => [42, 1])
      bytes = "a\xFFb".b
      args = [42, bytes, { "k\xFE".b => "caf\u00e9".b, "plain".b => "ascii".b }]
      expect { deliver(ChargeOrderJob.jobs.pop.merge("args" => args)) }
        .to raise_error(IdempotentJob::ConfigurationError, /\AChargeOrderJob: the payload cannot be written as JSON/)
      dead = Sidekiq::DeadSet.new.to_a
      expect(dead.size).to eq(1)
      base64 = ->(text) { { IdempotentJob::ArgsDigest::BYTES => [text].pack("m0") } }
      expect(dead.first.args).to eq([42, base64.call(bytes),
                                     { '"k\\xFE"' => base64.call("caf\u00e9".b), "plain" => "ascii" }])
      expect(dead.first.item["error_message"]).to start_with("ChargeOrderJob: the payload cannot be written as JSON")
      expect(Effects.count).to eq(0)
    ensure
      Sidekiq::DeadSet.new.clear
    end

    # Before: a rewritten key took the place of a key already spelled as its inspect
    # ({"\xFF".b => 1, "\"\\xFF\"" => 2} kept one value in the dead-letter copy).
    it "keeps every value when a rewritten binary key is spelled like a key the Hash already has" do
      Sidekiq::DeadSet.new.clear
      Sidekiq::Client.push("class" => "ChargeOrderJob", "args" => [42, 1])
      spelled = "\xFF".b.inspect
      args = [42, { "\xFF".b => 1, spelled => 2, "#{spelled} (2)" => 3, "\xFF".dup.force_encoding("UTF-8") => 4 }]
      expect { deliver(ChargeOrderJob.jobs.pop.merge("args" => args)) }
        .to raise_error(IdempotentJob::ConfigurationError, /\AChargeOrderJob: the payload cannot be written as JSON/)
      dead = Sidekiq::DeadSet.new.to_a
      expect(dead.size).to eq(1)
      expect(dead.first.args).to eq([42, { "#{spelled} (3)" => 1, spelled => 2, "#{spelled} (2)" => 3,
                                           "#{spelled} (4)" => 4 }])
      expect(IdempotentJob::ArgsDigest.writable(args).last.size).to eq(4)
    ensure
      Sidekiq::DeadSet.new.clear
    end
  end

  describe "idempotency_* options without idempotency_key (fresh-user trial: the key forgotten)" do
    it "is pushed (a base class's defaults are legitimate) with one warning per class naming the job and the options" do
      log = StringIO.new
      logger = IdempotentJob.configuration.logger
      IdempotentJob.configuration.logger = Logger.new(log)
      job = sidekiq_job("ForgotKeyJob") { sidekiq_options idempotency_lease: 60, idempotency_on_stale: :hold }
      expect { 2.times { job.perform_async(42, 1) } }.to change { job.jobs.size }.by(2)
      expect { ChargeOrderJob.set(idempotency_key: nil, idempotency_lease: 9).perform_async(42, 1) }
        .to change { ChargeOrderJob.jobs.size }.by(1)
      plain = sidekiq_job("PlainPassThroughJob") { sidekiq_options retry: 1 } # the control: no idempotency_* option
      expect { plain.perform_async(42, 1) }.to change { plain.jobs.size }.by(1)
      lines = log.string.lines.grep(/without idempotency_key/)
      expect(lines.size).to eq(2)
      expect(lines[0]).to include("ForgotKeyJob: idempotency_lease, idempotency_on_stale without idempotency_key: " \
                                  "the job runs unguarded")
      expect(lines[0]).to include("declare idempotency_key")
      expect(lines[1]).to include("ChargeOrderJob: idempotency_lease without idempotency_key")
    ensure
      IdempotentJob.configuration.logger = logger
      IdempotentJob::Sidekiq::Options::KEYLESS_WARNED.clear
    end

    it "warns each anonymous class once (keyed by the class, not its nil name) and says how to silence it" do
      log = StringIO.new
      logger = IdempotentJob.configuration.logger
      IdempotentJob.configuration.logger = Logger.new(log)
      anonymous = Array.new(2) do
        Class.new do
          include Sidekiq::Job
          sidekiq_options idempotency_lease: 60

          def perform(*); end
        end
      end
      anonymous.each { |job| 2.times { job.perform_async(42, 1) } }
      lines = log.string.lines.grep(/without idempotency_key/)
      expect(lines.size).to eq(2)
      expect(lines[0]).to include("set them to nil in the class (sidekiq_options idempotency_lease: nil) " \
                                  "to silence this warning")
      # The advice works: a subclass of a base with idempotency_* defaults that sets them to nil
      # is not warned (nor refused).
      base = sidekiq_job("KeylessBaseJob") { sidekiq_options idempotency_lease: 60, idempotency_on_stale: :hold }
      quiet = Class.new(base) { sidekiq_options idempotency_lease: nil, idempotency_on_stale: nil }
      stub_const("QuietKeylessJob", quiet)
      expect { quiet.perform_async(42, 1) }.to change { quiet.jobs.size }.by(1)
      expect(log.string.lines.grep(/without idempotency_key/).size).to eq(2)
    ensure
      IdempotentJob.configuration.logger = logger
      IdempotentJob::Sidekiq::Options::KEYLESS_WARNED.clear
    end
  end

  describe "a misspelled or mistyped option in a per-push set(...) override (issue 25 item 2)" do
    it "is refused at the push (Sidekiq's real client and its middleware), and nothing is enqueued" do
      expect { ChargeOrderJob.set(idempotency_on_stail: :hold).perform_async(42, 1) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /\AChargeOrderJob: unknown option idempotency_on_stail \(did you mean idempotency_on_stale\?\)/)
      expect { ChargeOrderJob.set(idempotency_heartbeat: "false").perform_async(42, 1) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /ChargeOrderJob: idempotency_heartbeat must be true or false/)
      expect(ChargeOrderJob.jobs).to be_empty
      ChargeOrderJob.set(idempotency_on_stale: :hold).perform_async(42, 1) # the control: a correct override
      expect(ChargeOrderJob.jobs.last).to include("idempotency_on_stale" => "hold")
    end

    it "is refused before it reaches Redis (Sidekiq's client against the suite's Redis, testing mode off)" do
      Sidekiq::Testing.disable! do
        Sidekiq.redis { |r| r.del("queue:bad_input") }
        expect { ChargeOrderJob.set(queue: "bad_input", idempotency_leese: 60).perform_async(42, 1) }
          .to raise_error(IdempotentJob::ConfigurationError,
                          /unknown option idempotency_leese \(did you mean idempotency_lease\?\)/)
        expect(Sidekiq.redis { |r| r.llen("queue:bad_input") }).to eq(0)
        ChargeOrderJob.set(queue: "bad_input", idempotency_lease: 60).perform_async(42, 1) # the control
        expect(Sidekiq.redis { |r| r.llen("queue:bad_input") }).to eq(1)
      ensure
        Sidekiq.redis { |r| r.del("queue:bad_input") }
      end
    end
  end

  describe "a Rails-style DATABASE_URL (issue 25 item 3)" do
    let(:rails_query) do
      "pool=25&encoding=unicode&timeout=5000&reconnect=true&prepared_statements=false&application_name=rails_app" \
        "&connect_timeout=3&sslmode=disable&variables%5Bstatement_timeout%5D=5000&checkout_timeout=5&idle_timeout=300" \
        "&schema_search_path=public&statement_limit=100"
    end
    let(:log) { StringIO.new }

    after { ENV.delete("IDEMPOTENT_JOB_DATABASE_URL") }

    it "works as the app has it (read from the environment): its pool sizes the gem's pool, the rest is logged once" do
      ENV["IDEMPOTENT_JOB_DATABASE_URL"] = "#{SpecServices.database_url}?#{rails_query}"
      IdempotentJob.reset!
      IdempotentJob.configure { |c| c.logger = Logger.new(log) }
      expect(IdempotentJob.configuration.effective_pool_size).to eq(25)
      outcome = IdempotentJob.perform_once("RailsUrl", "order-1") { :ran }
      expect(outcome.value).to eq(:ran)
      lines = log.string.lines.grep(/database_url parameters ignored/)
      expect(lines.size).to eq(1)
      expect(lines.first).to include("encoding, timeout, reconnect, variables[statement_timeout], checkout_timeout, " \
                                     "idle_timeout, schema_search_path, statement_limit")
      expect(lines.first).not_to include("pool,")
    end

    it "refuses a parameter nobody knows, naming it (and the nearest known one)" do
      expect { IdempotentJob.configure(database_url: "#{SpecServices.database_url}?pool=5&poool=3") }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /neither PostgreSQL \(libpq\) nor Rails knows: poool \(did you mean pool\?\)/)
    end

    it "lets an explicit pool_size win over the URL's pool" do
      IdempotentJob.configure(database_url: "#{SpecServices.database_url}?pool=25", pool_size: 3)
      expect(IdempotentJob.configuration.effective_pool_size).to eq(3)
    end
  end

  describe "a DATABASE_URL whose host or port has no PostgreSQL (fresh-user trial)" do
    it "says which host and port it tried and what to check, not only the socket's error" do
      closed_port = Integer(ENV.fetch("PG_PORT", "5432")) + 9 # nothing listens there
      IdempotentJob.configure(database_url: "postgres://postgres@127.0.0.1:#{closed_port}/app", deadline: 1)
      expect { IdempotentJob.perform_once("WrongPort", "order-1") { raise "must not run" } }
        .to raise_error(IdempotentJob::ConnectionError,
                        /Connection refused.*127\.0\.0\.1:#{closed_port}.*check database_url/)
    end
  end

  describe "keys compared byte for byte (issue 25 item 6)" do
    let(:runs) { [] }

    def once(key)
      IdempotentJob.perform_once("ByteKey", key) { runs << key }
    end

    it "runs NFC and NFD forms, full-width and ASCII digits, and keys differing by a space as different operations" do
      pairs = [%w[café café], %w[１２ 12], ["A1 ", "A1"], [" A1", "A1"]]
      pairs.flatten.uniq.each { |key| 2.times { once(key) } }
      expect(runs).to eq(pairs.flatten.uniq) # each once: a different byte string is a different operation
      expect(IdempotentJob.record("ByteKey", "cafe\u0301").operation_key.bytes).to eq("cafe\u0301".bytes)
    end

    it "takes a Symbol by its whole name, never cut at a NUL: alone it is refused, in a Hash or Array distinct" do
      expect { once(:"a\x00b") }.to raise_error(IdempotentJob::OperationKeyError, /ByteKey: .*NUL/)
      expect(runs).to be_empty
      keys = [[:"a\x00c"], ["a"], { "k" => :"a\x00d" }, { "k" => "a" }]
      keys.each { |key| 2.times { once(key) } }
      expect(runs).to eq(keys) # each once: the Symbol's NUL is in its canonical JSON (\u0000)
      # Payloads and facts too: the args digest of :"a\0b" is not that of :"a".
      expect(IdempotentJob::Native.facts_json({ "s" => :"x\x00y" })).to eq(['{"s":"x\\u0000y"}', nil])
    end

    it "refuses a key that is not valid UTF-8 with OperationKeyError naming the job, wherever it comes from" do
      bad = "ab\xFF".dup.force_encoding(Encoding::UTF_8)
      message = /not valid UTF-8 \(an invalid byte at offset 2\)/
      {
        # What every door does with a job's arguments (Sidekiq's own client refuses
        # arguments JSON cannot write before any middleware: its JSON::GeneratorError).
        -> { IdempotentJob::Key.new(ChargeOrderJob, :order_id).operation_key([bad, 1]) } => "ChargeOrderJob",
        -> { IdempotentJob::Key.new(ChargeOrderJob, 0).operation_key([{ "id" => bad }, 1]) } => "ChargeOrderJob",
        -> { IdempotentJob::Key.new(ChargeOrderJob, [0, 1]).operation_key([1, { bad => 2 }]) } => "ChargeOrderJob",
        -> { IdempotentJob.perform_once("Refund", bad) { runs << :ran } } => "Refund",
        -> { IdempotentJob.perform_once("Refund", [bad, 1]) { runs << :ran } } => "Refund",
        -> { IdempotentJob.record("Refund", bad) } => "Refund"
      }.each do |call, job|
        expect(&call).to raise_error(IdempotentJob::OperationKeyError, /\A#{job}: .*#{message}/)
      end
      expect(runs).to be_empty
    end

    it "refuses a job type that is not valid UTF-8 with ConfigurationError naming it, in every call (issue 29)" do
      bad = "Refund\xFF".dup.force_encoding(Encoding::UTF_8)
      [-> { IdempotentJob.perform_once(bad, "1") { runs << :ran } },
       -> { IdempotentJob.perform_once(bad.b, "1") { runs << :ran } },
       -> { IdempotentJob.record(bad, "1") },
       -> { IdempotentJob.held(job_type: bad) },
       -> { IdempotentJob::Repeats.report(since: Time.now, job_type: bad) },
       -> { IdempotentJob.resolve(bad, "1", as: :done) },
       -> { IdempotentJob::Delivery.new(job_type: bad, operation_key: "1") }].each do |call|
        expect(&call).to raise_error(IdempotentJob::ConfigurationError,
                                     /\Athe job type "Refund\\xFF" is not valid UTF-8: .*nothing was run or recorded/)
      end
      expect(runs).to be_empty
      IdempotentJob.perform_once("R\u00e9fund".b, "1") { runs << :ran } # valid UTF-8 bytes: that text
      expect(IdempotentJob.record("R\u00e9fund", "1").status).to eq(:completed)
    end

    # Before: -1 reached PostgreSQL ("LIMIT must not be negative": a DatabaseError).
    it "refuses held(limit:) below 1 with ConfigurationError stating the valid range" do
      [-1, 0].each do |limit|
        expect { IdempotentJob.held(limit:) }
          .to raise_error(IdempotentJob::ConfigurationError,
                          /\Aheld needs a limit of at least 1 \(up to \d+\), got #{limit}\z/)
      end
    end

    # Before: Integer(limit) took 1.5 as 1 and "5" as 5 (and purge's batch_size alike).
    it "refuses held(limit:) and purge(batch_size:) that are not Integers with the core's words" do
      [1.5, "5", 2.0, nil].each do |limit|
        expect { IdempotentJob.held(limit:) }
          .to raise_error(IdempotentJob::ConfigurationError,
                          /\Aheld needs a limit of at least 1 \(up to \d+\), got #{Regexp.escape(limit.inspect)}\z/)
        expect { IdempotentJob.purge(older_than: 10**9, batch_size: limit) }
          .to raise_error(IdempotentJob::ConfigurationError,
                          "purge needs older_than >= 0 seconds and a batch of at least 1, got 1000000000 and " \
                          "#{limit.inspect}")
      end
    end

    # As Python's held(limit=10**400) since 92cbd67: an Integer beyond 64 bits is clamped
    # (a huge limit is no limit; a hugely negative one refused by the core). Before, the
    # native conversion raised RangeError ("bignum too big to convert into `long long'").
    it "takes held(limit:) beyond 64 bits as no limit, and refuses a hugely negative one with the core's words" do
      expect(IdempotentJob.held(limit: 2**64)).to be_an(Array)
      expect { IdempotentJob.held(limit: -(2**64)) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /\Aheld needs a limit of at least 1 \(up to \d+\), got -9223372036854775808\z/)
    end

    # Before: Float(older_than) raised TypeError for true and nil and took "30" as 30 s
    # (Python's purge(older_than=True) deleted what finished more than 1 s ago).
    it "refuses a purge age that is no number of seconds (true, \"30\", nil) in the core's words, deleting nothing" do
      [true, "30", nil, [1]].each do |age|
        expect { IdempotentJob.purge(older_than: age) }
          .to raise_error(IdempotentJob::ConfigurationError,
                          "purge needs older_than >= 0 seconds and a batch of at least 1, got #{age.inspect} and 1000")
      end
      expect(IdempotentJob.purge(older_than: Rational(10**12, 1))).to eq(0)
    end

    # An age reaching before PostgreSQL's first timestamp (4714 BC): no record is that old.
    # Before, the statement's now() - make_interval(secs => 2**64) raised DatabaseError
    # 'timestamp out of range (SQLSTATE 22008)' (Python's purge(older_than=2**64) alike).
    it "purges nothing older than PostgreSQL's first timestamp (older_than: 2**64), never a DatabaseError" do
      once("purged-never")
      expect(IdempotentJob.purge(older_than: 2**64)).to eq(0)
      expect(IdempotentJob.purge(older_than: 1e300, batch_size: 1)).to eq(0)
    end

    it "takes a binary String whose bytes are UTF-8 as those bytes (the same operation as the UTF-8 String)" do
      once("caf\u00e9".b)
      once("caf\u00e9")
      expect(runs.size).to eq(1)
    end
  end

  describe "a plain-API or repeats-report argument of the wrong kind (fresh-clone trial)" do
    let(:runs) { [] }

    it "refuses facts: that are not a Hash with ConfigurationError naming the job; nothing runs or is recorded" do
      [[1], "receive_count=2", 42].each do |facts|
        expect { IdempotentJob.perform_once("FactsRefund", "1", facts:) { runs << :ran } }
          .to raise_error(IdempotentJob::ConfigurationError,
                          /\AFactsRefund: perform_once's facts: must be a Hash .*got #{Regexp.escape(facts.inspect)}; /)
      end
      expect(runs).to be_empty
      expect(IdempotentJob.record("FactsRefund", "1")).to be_nil
      IdempotentJob.perform_once("FactsRefund", "1", facts: { receive_count: 2 }) { runs << :ran }
      expect(runs).to eq([:ran])
    end

    # Before: restart_window.to_f took nil and "abc" as 0 s and "90" as 90, and raised
    # NoMethodError for true (and only when an operation was repeated).
    it "refuses a restart_window: that is no number of seconds in the core's words, repeats or none" do
      IdempotentJob.perform_once("WindowJob", "1") { nil }
      IdempotentJob.perform_once("WindowJob", "1") { nil }
      [true, nil, "abc", "90", [1], -1].each do |window|
        [-> { IdempotentJob.repeats(job_type: "WindowJob", restart_window: window) },
         -> { IdempotentJob.repeats(job_type: "NoSuchWindowJob", restart_window: window) },
         -> { IdempotentJob::Repeats::Classifier.classify([], restart_window: window) }].each do |call|
          expect(&call).to raise_error(IdempotentJob::ConfigurationError,
                                       "restart_window must be a finite number of seconds, 0 or more, got " \
                                       "#{window.inspect}")
        end
      end
      expect(IdempotentJob.repeats(job_type: "WindowJob", restart_window: Rational(3, 2))).to be_an(Array)
    end

    it "refuses a since: or restarts: that is not a time (a String read as 0 would list every repeat ever)" do
      calls = {
        -> { IdempotentJob.repeats(since: "yesterday") } =>
          /\Arepeats: since must be a Time or epoch seconds, got "yesterday"/,
        -> { IdempotentJob::Repeats.report(since: "2026-11-29") } => /\Arepeats: since must be a Time/,
        -> { IdempotentJob.repeats(restarts: ["2026-11-29T10:00:00Z"]) } =>
          /\Arepeats: restarts must be Times or epoch seconds, got "2026-11-29T10:00:00Z"/,
        -> { IdempotentJob.repeats(restarts: Time.now) } => /\Arepeats: restarts must be an Array/
      }
      calls.each { |call, message| expect(&call).to raise_error(IdempotentJob::ConfigurationError, message) }
      expect(IdempotentJob.repeats(since: Time.now.to_f - 60, restarts: [Time.now, Time.now.to_i])).to be_an(Array)
    end
  end
end
