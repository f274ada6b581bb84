# frozen_string_literal: true

require "spec_helper"
require "open3"
require "rbconfig"
require "tempfile"
require "tmpdir"
require "yaml"

# The pages a user reads — README.md and docs/*.md — checked as written:
# * every ```ruby sample runs, as written, in a fresh Ruby process against the suite's
#   PostgreSQL and Redis. Stand-ins replace only the outside services the samples name
#   (a payment gateway, StatsD, an SQS client, Devise's `authenticate` route helper); a
#   few samples first get the state they talk about (held operations to resolve) and
#   are then checked for their effect (the quick start's charge ran once);
# * every ```sql sample is a statement the gem sends;
# * every ```sh line names a bin/ script (with flags it knows) or a rake task that exists;
# * every ```python sample parses;
# * every relative link and #anchor between the pages resolves.
module DocPages
  ROOT = File.expand_path("../..", __dir__)

  Sample = Struct.new(:page, :line, :lang, :code) do
    def to_s = "#{page}:#{line} (```#{lang}: #{code.lines.first.to_s.strip[0, 60]})"
  end

  module_function

  def pages = ["README.md", *Dir.glob("docs/*.md", base: ROOT).sort]

  def text(page) = File.read(File.join(ROOT, page))

  # The fenced blocks of a page, each with the line of its opening fence. An indented
  # block (inside a list item) loses its indentation.
  def samples(page, text = DocPages.text(page))
    found = []
    open = nil
    text.each_line.with_index(1) do |line, number|
      if (fence = line.match(/\A( *)```(\w*)\s*\z/))
        if open
          found << Sample.new(page, open[:line], open[:lang], open[:lines].join)
          open = nil
        else
          open = { line: number, lang: fence[2], indent: fence[1].size, lines: [] }
        end
      elsif open
        open[:lines] << line.sub(/\A {0,#{open[:indent]}}/, "")
      end
    end
    raise "#{page}:#{open[:line]}: a ``` block is never closed" if open

    found
  end

  def all_samples = pages.flat_map { |page| samples(page) }

  # GitHub's anchors: the heading in lower case, punctuation dropped, spaces as hyphens.
  def anchors(page)
    text(page).gsub(/^ *```.*?^ *```/m, "").scan(/^#+ (.+)$/).map do |(heading)|
      heading.strip.downcase.gsub(/[^\p{Word}\- ]/, "").tr(" ", "-")
    end
  end

  # Every [text](target) outside code blocks, as [page, target].
  def links(page)
    text(page).gsub(/^ *```.*?^ *```/m, "").scan(/\]\(([^)\s]+)\)/).map { |(target)| [page, target] }
  end
end

# The world every Ruby sample of the pages runs in: the gem configured as the README
# says, and stand-ins for the outside services the samples name.
module DocSampleWorld
  PRELUDE = <<~'RUBY'
    $LOAD_PATH.unshift(File.join(ENV.fetch("DOC_ROOT"), "lib"))
    require "json"
    require "logger"
    require "pg"

    # The outside world of the samples. Each effect is a row in readme_effects, so a
    # count holds across the forked workers of the testing kit.
    module ReadmeEffects
      def self.db
        (@db ||= {})[Process.pid] ||= PG.connect(ENV.fetch("DATABASE_URL"))
      end

      def self.record(kind, reference) =
        db.exec_params("INSERT INTO readme_effects (kind, reference) VALUES ($1, $2)", [kind, reference.to_s])

      def self.count(kind) =
        db.exec_params("SELECT count(*) FROM readme_effects WHERE kind = $1", [kind]).getvalue(0, 0).to_i
    end

    module PaymentGateway
      def self.charge(order_id, _amount_cents) = Gateway.charge(order_id, nil, reference: order_id)
    end

    module Gateway
      # A charge's answer, as a provider's API gives one.
      def self.charge(order_id, _cents, reference:)
        ReadmeEffects.record("charge", reference || order_id)
        { "charge_id" => "ch_#{reference || order_id}" }
      end

      def self.capture(_payment_id, reference:) = ReadmeEffects.record("capture", reference)
      def self.find_capture(reference:) = nil
    end

    class Charge
      def self.count = ReadmeEffects.count("charge")
    end

    module StatsD
      def self.increment(name, tags: []) = ReadmeEffects.record("statsd", "#{name} #{tags.join(",")}")
    end

    # OpenTelemetry's API, as far as a tracer goes (the opentelemetry-sdk gem is not
    # installed here): each finished span is an effect.
    module OpenTelemetry
      Span = Struct.new(:name, :attributes) do
        def finish(end_timestamp: nil) = ReadmeEffects.record("span", name)
      end

      Tracer = Struct.new(:name) do
        def start_span(name, attributes: {}, start_timestamp: nil, kind: :internal) = Span.new(name, attributes)
      end

      def self.tracer_provider = self
      def self.tracer(name) = Tracer.new(name)
    end

    def check(what)
      raise "the sample did not do what the page says: #{what}" unless yield
    end

    require "sidekiq"
    require "idempotent_job/sidekiq"
    IdempotentJob.configure { |c| c.logger = Logger.new(File::NULL) }
    Sidekiq.logger.level = Logger::WARN
  RUBY

  # Runs a Sidekiq job's deliveries through the server middleware (Sidekiq's testing
  # harness, as the README tells its users to set it up).
  SIDEKIQ_INLINE = <<~'RUBY'
    require "sidekiq/testing"
    Sidekiq::Testing.server_middleware { |chain| chain.add IdempotentJob::Sidekiq::ServerMiddleware }
  RUBY

  # A held operation made the way a dead worker and :hold make one: a claim kept by an
  # interrupt, then a delivery after its lease.
  # A claim whose worker died: kept by an interrupt, stale once its lease has passed.
  # Then `then_deliver` is delivered until the lease is over (a delivery before that is
  # only deferred), and its decision returned.
  STALE = <<~'RUBY'
    def stale_claim!(job_type, key, **then_deliver)
      begin
        IdempotentJob.perform_once(job_type, key, lease: 0.25) { raise Interrupt }
      rescue Interrupt
        nil
      end
      200.times do
        decision = IdempotentJob.perform_once(job_type, key, **then_deliver) { nil }.decision
        return decision unless decision == :in_progress

        sleep 0.05
      end
      raise "the claim of #{key} never went stale"
    end
  RUBY

  # A multi-database Rails app's database.yml: a primary that is not PostgreSQL, and a
  # "queue" database naming the suite's by its fields; no DATABASE_URL.
  DATABASE_YML = <<~'RUBY'
    require "active_record"
    require "uri"
    module Rails
      def self.env = "development"
    end
    suite_url = ENV.delete("DATABASE_URL")
    url = URI(suite_url)
    ActiveRecord::Base.configurations = {
      "development" => {
        "primary" => { "adapter" => "sqlite3", "database" => "db/development.sqlite3" },
        "queue" => { "adapter" => "postgresql", "host" => url.host, "port" => url.port,
                     "database" => url.path.delete_prefix("/"), "username" => url.user }
      }
    }
  RUBY

  # A claim through the queue database's fields alone (DATABASE_URL is unset until the
  # record is read back).
  DATABASE_YML_USED = <<~'RUBY'
    outcome = IdempotentJob.perform_once("ChargeOrder", order_id) { :charged }
    record = IdempotentJob.record("ChargeOrder", order_id)
    no_url = IdempotentJob.configuration.database_url.nil?
    ENV["DATABASE_URL"] = suite_url
    check("the queue database of database.yml is used") { no_url && outcome.ran? && record.status == :completed }
  RUBY
end

# What a Ruby sample runs with, beyond DocSampleWorld::PRELUDE: code before it, code after
# it that checks what it did (raising when it did not), or another way to run it.
module DocSampleContexts
  include DocSampleWorld

  # What samples take as given: the operation they talk about.
  COMMON = "order_id = 42\ncents = 1500\n"

  # An application's ApplicationJob, for samples that subclass it (the inline adapter).
  ACTIVE_JOB = <<~'RUBY'
    require "active_job"
    ActiveJob::Base.queue_adapter = :inline
    ActiveJob::Base.logger = Logger.new(File::NULL)
    class ApplicationJob < ActiveJob::Base; end
  RUBY

  CONTEXTS = [
    [/\A# Gemfile/, { run: :gemfile }],
    [%r{\A# config/initializers/idempotent_job\.rb}, {
      after: <<~RUBY
        #{SIDEKIQ_INLINE}
        Sidekiq::Testing.inline! { 3.times { ChargeOrderJob.perform_async(42, 1500) } }
        check("the charge for order 42 ran once") { Charge.count == 1 }
      RUBY
    }],
    [/\A# Records in database\.yml's "queue" database instead of the primary/,
     { before: DATABASE_YML, after: DATABASE_YML_USED }],
    [/include IdempotentJob::ActiveJob\n  idempotency key: :order_id, lease: 60/, {
      after: <<~'RUBY'
        3.times { ChargeOrderJob.perform_later(42, 1500) }
        check("the charge for order 42 ran once") { Charge.count == 1 }
      RUBY
    }],
    [/\Aoutcome = IdempotentJob\.perform_once\("ChargeOrder", order_id, lease: 60, payload:/, {
      after: <<~'RUBY'
        check("the block ran") { outcome.ran? && outcome.decision == :ran && Charge.count == 1 }
        again = IdempotentJob.perform_once("ChargeOrder", order_id, lease: 60, payload: [order_id, cents]) { raise }
        check("a second call is turned away") { again.decision == :completed && Charge.count == 1 }
      RUBY
    }],
    [/\Aloop do\n  sqs\.receive_message/, {
      before: <<~'RUBY',
        # An SQS client's shape: one message, then nothing (StopIteration ends `loop`).
        Message = Struct.new(:body, :attributes, :message_id, :receipt_handle)
        class FakeSqs
          attr_reader :deleted

          def initialize(messages)
            @batches = [messages]
            @deleted = []
          end

          def receive_message(**) = Struct.new(:messages).new(@batches.shift || raise(StopIteration))
          def delete_message(queue_url:, receipt_handle:) = @deleted << receipt_handle
          def change_message_visibility(**) = raise("not in progress")
        end
        sqs = FakeSqs.new([Message.new({ "id" => 7, "cents" => 100 }.to_json,
                                       { "ApproximateReceiveCount" => "1" }, "m-1", "r-1")])
        queue_url = "https://sqs.example/queue"
        logger = Logger.new($stderr)
      RUBY
      after: 'check("the message ran once and was deleted") { sqs.deleted == ["r-1"] && Charge.count == 1 }'
    }],
    [/\Aclass RecordPaymentJob/, {
      before: <<~'RUBY',
        ReadmeEffects.db.exec("CREATE TABLE IF NOT EXISTS payments (payment_id text, cents integer)")
        ReadmeEffects.db.exec("TRUNCATE payments")
      RUBY
      after: <<~RUBY
        #{SIDEKIQ_INLINE}
        Sidekiq::Testing.inline! { 3.times { RecordPaymentJob.perform_async("pay_1", 500) } }
        rows = ReadmeEffects.db.exec("SELECT count(*), sum(cents) FROM payments").values
        check("one payment row") { rows == [%w[1 500]] }
      RUBY
    }],
    [/\AIdempotentJob\.held/, {
      before: <<~RUBY,
        #{STALE}
        %w[pay_9 pay_8].each { |key| stale_claim!("CapturePaymentJob", key, on_stale: :hold) == :held || raise }
      RUBY
      after: <<~'RUBY'
        check("pay_9 completed, pay_8 released for its rerun") do
          IdempotentJob.record("CapturePaymentJob", "pay_9").status == :completed &&
            IdempotentJob.record("CapturePaymentJob", "pay_8").status == :released
        end
      RUBY
    }],
    [/\AIdempotentJob\.subscribe/, {
      before: "require \"active_support\"\nrequire \"active_support/notifications\"\n#{STALE}",
      after: <<~'RUBY'
        stale_claim!("ChargeOrder", 2)
        check("StatsD counted the takeover") { ReadmeEffects.count("statsd") == 1 }
      RUBY
    }],
    [%r{\A# config/routes\.rb}, {
      before: <<~'RUBY',
        require "rails"
        require "action_dispatch"
        # Devise's route helper: a scope that lets its block's routes through.
        module DeviseStandIn
          def authenticate(_scope, _constraint = nil) = yield
        end
        ActionDispatch::Routing::Mapper.include(DeviseStandIn)
        routes = ActionDispatch::Routing::RouteSet.new
      RUBY
      wrap: "routes.draw do\n%s\nend\n",
      after: <<~'RUBY'
        check("mounted at /idempotency") { routes.routes.any? { |r| r.path.spec.to_s.start_with?("/idempotency") } }
      RUBY
    }],
    [%r{\A# spec/spec_helper\.rb}, {
      # The README's spec setup against the README's quick-start job: the kit's whole
      # matcher, run by RSpec.
      before: "require \"rspec/autorun\"\n",
      include_sample: %r{\A# config/initializers/idempotent_job\.rb}
    }]
  ].freeze

  def self.for(sample) = CONTEXTS.find { |pattern, _| sample.code.match?(pattern) }&.last || {}

  # A Ruby script that runs the sample as written (evaluated with its page and line,
  # so a failure points at them).
  def self.script(sample)
    context = self.for(sample)
    return gemfile_script(sample) if context[:run] == :gemfile

    included = included_sample(context)
    call = "eval(SAMPLE, #{context[:wrap] ? "binding" : "DOC"}, #{sample.page.dump}, #{sample.line + 1})"
    # One binding for the sample and the checks after it, so they see its local variables.
    <<~RUBY
      # frozen_string_literal: false
      #{DocSampleWorld::PRELUDE}
      DOC = binding
      #{COMMON}
      #{ACTIVE_JOB if sample.code.include?("ApplicationJob")}
      #{context[:before]}
      #{"eval(#{included.code.dump}, DOC, #{included.page.dump}, #{included.line + 1})" if included}
      SAMPLE = #{sample.code.dump}
      #{context[:wrap] ? format(context[:wrap], call) : call}
      eval(#{context[:after].to_s.dump}, DOC, "after the sample", 1)
      puts "SAMPLE RAN"
    RUBY
  end

  # Another sample this one builds on (run first, in the same binding).
  def self.included_sample(context)
    context[:include_sample] && DocPages.all_samples.find { |s| s.code.match?(context[:include_sample]) }
  end

  # A Gemfile sample, read by Bundler's own Gemfile reader in an application beside a
  # checkout named idempotent_job (what a `path:` sample assumes).
  def self.gemfile_script(sample)
    <<~RUBY
            require "bundler"
            require "tmpdir"
      require "yaml"
            Dir.mktmpdir do |dir|
              File.symlink(ENV.fetch("DOC_ROOT"), File.join(dir, "idempotent_job"))
              Dir.mkdir(app = File.join(dir, "app"))
              ENV["BUNDLE_GEMFILE"] = File.join(app, "Gemfile")
              File.write(ENV["BUNDLE_GEMFILE"], "")
              Dir.chdir(app) do
                dsl = Bundler::Dsl.new
                dsl.instance_eval(#{sample.code.dump}, #{sample.page.dump}, #{sample.line + 1})
                names = dsl.dependencies.map(&:name)
                raise "the Gemfile names \#{names.inspect}" unless names == ["idempotent_job"]
                path = dsl.dependencies.first.source&.path
                raise "no idempotent_job.gemspec at \#{path}" if path && !File.exist?(File.join(app, path.to_s, "idempotent_job.gemspec"))
              end
            end
            puts "SAMPLE RAN"
    RUBY
  end
end

RSpec.describe "README.md and docs/*.md" do
  before(:all) do
    Effects.connection.exec("CREATE TABLE IF NOT EXISTS readme_effects (kind text NOT NULL, reference text NOT NULL)")
  end

  before { Effects.connection.exec("TRUNCATE readme_effects") }

  def run_ruby(script)
    Tempfile.create(["doc_sample", ".rb"]) do |file|
      file.write(script)
      file.flush
      # Outside the checkout, so RSpec in a sample does not read the suite's .rspec.
      Open3.capture2e({ "DOC_ROOT" => DocPages::ROOT, "SPEC_OPTS" => nil }, RbConfig.ruby, file.path, chdir: Dir.tmpdir)
    end
  end

  it "finds the samples of every page, README.md and docs/ alike" do
    expect(DocPages.pages).to include("README.md", "docs/design.md", "docs/benchmarks.md", "docs/contributing.md")
    expect(DocPages.all_samples.map(&:lang)).to include("ruby", "sql", "sh", "python")
  end

  DocPages.all_samples.select { |s| s.lang == "ruby" }.each do |sample|
    it "runs the Ruby sample at #{sample}" do
      out, status = run_ruby(DocSampleContexts.script(sample))
      expect(status).to be_success, out
      expect(out).to include("SAMPLE RAN")
    end
  end

  it "shows each SQL sample exactly as the native core sends it" do
    statements = [IdempotentJob.claim_sql, IdempotentJob.repeats_sql].map(&:strip)
    sql = DocPages.all_samples.select { |s| s.lang == "sql" }
    expect(sql).not_to be_empty
    sql.each { |sample| expect(statements).to include(sample.code.strip), "#{sample} is not a statement the gem sends" }
    expect(sql.map { |s| s.code.strip }).to include(*statements)
  end

  it "names only scripts, flags and rake tasks that exist in its shell samples" do
    tasks, status = Open3.capture2e(RbConfig.ruby, "-e", <<~RUBY, chdir: DocPages::ROOT)
      require "rake"
      Rake.application.init("rake", [])
      load "Rakefile"
      $LOAD_PATH.unshift("lib")
      require "idempotent_job/rake_tasks"
      puts Rake::Task.tasks.map(&:name)
    RUBY
    expect(status).to be_success, tasks
    gem_tasks = tasks.lines.map(&:strip).grep(/\Aidempotent_job:/)
    expect(gem_tasks.reject do |task|
             DocPages.text("README.md").include?(task)
           end).to eq([]), "rake tasks the README omits"
    sources = Dir.glob("{bin/*,soak/**/*.rb,bench/**/*.rb}", base: DocPages::ROOT)
                 .to_h { |f| [f, File.read(File.join(DocPages::ROOT, f))] }
    DocPages.all_samples.select { |s| s.lang == "sh" }.each do |sample|
      sample.code.each_line.map { |l| l.sub(/#.*/, "").strip }.reject(&:empty?).each do |line|
        line.split("&&").map(&:strip).each do |command|
          case command
          when %r{\A(?:\w+=\S+ )*(bin/[\w-]+)(.*)}
            script = Regexp.last_match(1)
            expect(File.executable?(File.join(DocPages::ROOT, script))).to be(true), "#{sample}: #{script} missing"
            Regexp.last_match(2).scan(/--[a-z][\w-]*/).each do |flag|
              known = sources.select do |f, text|
                (f == script || !f.start_with?("bin/")) && text.match?(/#{flag}(?![\w-])/)
              end
              expect(known).not_to be_empty, "#{sample}: #{script} #{flag} is named nowhere in its sources"
            end
          when /\Arake ([\w:]+)/
            expect(tasks.lines.map(&:strip)).to include(Regexp.last_match(1)), "#{sample}: no rake task #{command}"
          end
        end
      end
    end
  end

  it "names only classes, modules and methods of the gem that exist" do
    names = DocPages.pages.flat_map do |page|
      DocPages.text(page).scan(/IdempotentJob(?:::[A-Z]\w*)*(?:\.[a-z_]\w*[!?]?)?/)
    end
    out, status = Open3.capture2e({ "DOC_ROOT" => DocPages::ROOT }, RbConfig.ruby, "-e", <<~RUBY)
      $LOAD_PATH.unshift(File.join(ENV.fetch("DOC_ROOT"), "lib"))
      require "json"
      %w[sidekiq sidekiq/web active_job idempotent_job idempotent_job/sidekiq idempotent_job/active_job
         idempotent_job/testing idempotent_job/web].each { |lib| require lib }
      missing = #{names.uniq.sort.inspect}.reject do |name|
        path, method = name.split(".", 2)
        owner = Object.const_get(path)
        method.nil? || owner.respond_to?(method) || owner.respond_to?("\#{method}=")
      rescue NameError
        false
      end
      puts missing.to_json
    RUBY
    expect(status).to be_success, out
    expect(JSON.parse(out.lines.last)).to eq([])
  end

  # The README's reference tables name exactly what the gem has: a setting, option or
  # event added or renamed in the code must be added or renamed there too.
  def readme_section(heading)
    DocPages.text("README.md")[/^#+ #{Regexp.escape(heading)}\n(.*?)(?=^#+ )/m, 1] or raise "no section #{heading}"
  end

  def first_column_names(section)
    section.scan(/^\| (.+?) \|/).flat_map { |(cell)| cell.scan(/`([A-Za-z_]+):?`/).flatten }
  end

  it "lists every setting of IdempotentJob.configure, and no other" do
    expect(first_column_names(readme_section("Configuration")).sort)
      .to eq(IdempotentJob::Configuration::SETTINGS.map(&:to_s).sort)
  end

  it "lists every per-job option, and no other" do
    names = first_column_names(readme_section("Per-job options")).map { |name| name.delete_prefix("idempotency_") }
    expect(names.sort).to eq(IdempotentJob::JobOptions::NAMES.map(&:to_s).sort)
  end

  it "lists every error class of the gem, and no other" do
    errors = IdempotentJob.constants.map { |name| IdempotentJob.const_get(name) }
                          .select { |c| c.is_a?(Class) && c < IdempotentJob::Error }
    expect(first_column_names(readme_section("Errors")).sort).to eq(errors.map { |c| c.name.split("::").last }.sort)
  end

  it "names every event, and no other" do
    names = readme_section("Events")[/^Names: (.*?`)\./m, 1].to_s.scan(/`(\w+)`/).flatten
    expect(names.sort).to eq(IdempotentJob::Events::NAMES.map(&:to_s).sort)
  end

  it "has YAML samples that parse" do
    DocPages.all_samples.select { |s| %w[yaml yml].include?(s.lang) }.each do |sample|
      expect { YAML.safe_load(sample.code) }.not_to raise_error, sample.to_s
    end
  end

  it "has Python samples that parse" do
    DocPages.all_samples.select { |s| s.lang == "python" }.each do |sample|
      out, status = Open3.capture2e("python3", "-c", "import ast, sys; ast.parse(sys.stdin.read())",
                                    stdin_data: sample.code)
      expect(status).to be_success, "#{sample}: #{out}"
    end
  end

  it "links only to pages and headings that exist" do
    broken = DocPages.pages.flat_map { |page| DocPages.links(page) }.filter_map do |page, target|
      next if target.match?(/\A[a-z]+:/)

      path, anchor = target.split("#", 2)
      file = path.empty? ? page : File.expand_path(path, File.dirname(File.join(DocPages::ROOT, page)))
      file = file.delete_prefix("#{DocPages::ROOT}/")
      if !File.exist?(File.join(DocPages::ROOT, file))
        "#{page}: #{target} (no such file)"
      elsif anchor && file.end_with?(".md") && !DocPages.anchors(file).include?(anchor)
        "#{page}: #{target} (no such heading)"
      end
    end
    expect(broken).to be_empty
  end
end
