# frozen_string_literal: true

require "spec_helper"
require "fileutils"

# Behind PgBouncer 1.18 in transaction pooling mode, where named prepared statements
# break: with `prepared_statements: false` every statement of the claim protocol is
# sent unnamed.
RSpec.describe "Behind PgBouncer in transaction mode", :integration do
  let(:root) { File.expand_path("../..", __dir__) }
  let(:dir) { File.join(root, "tmp", "pgbouncer") }
  let(:port) { Integer(ENV.fetch("PGBOUNCER_SPEC_PORT", "64329")) }
  let(:seconds) { Float(ENV.fetch("PGBOUNCER_SOAK_SECONDS", "30")) }

  def as_postgres(command)
    root_user = Process.uid.zero?
    system(root_user ? "su postgres -s /bin/sh -c '#{command}'" : command, exception: true)
  end

  before do
    FileUtils.rm_rf(dir)
    FileUtils.mkdir_p(dir)
    uri = URI.parse(SpecServices.database_url)
    File.write(File.join(dir, "userlist.txt"), %("postgres" ""\n))
    File.write(File.join(dir, "pgbouncer.ini"), <<~INI)
      [databases]
      idempotent_job = host=#{uri.host} port=#{uri.port} dbname=#{uri.path.delete_prefix("/")}
      [pgbouncer]
      listen_addr = 127.0.0.1
      listen_port = #{port}
      unix_socket_dir = #{dir}
      auth_type = trust
      auth_file = #{dir}/userlist.txt
      pool_mode = transaction
      max_client_conn = 200
      default_pool_size = 8
      ignore_startup_parameters = extra_float_digits,options
      logfile = #{dir}/pgbouncer.log
      pidfile = #{dir}/pgbouncer.pid
    INI
    FileUtils.chown_R("postgres", "postgres", dir) if Process.uid.zero?
    as_postgres("pgbouncer -d #{dir}/pgbouncer.ini")
    sleep 0.3
  end

  # An immediate shutdown, waited for (the next example binds the same port): SIGTERM up to
  # PgBouncer 1.22; from 1.23 SIGTERM waits for every client to disconnect and SIGQUIT is it.
  after do
    pid = File.read(File.join(dir, "pgbouncer.pid")).to_i
    version = Gem::Version.new(`pgbouncer --version`[/PgBouncer (\d+(\.\d+)*)/, 1] || "0")
    Process.kill(version >= Gem::Version.new("1.23") ? :QUIT : :TERM, pid)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      Process.kill(0, pid)
      sleep 0.05
    end
    raise "pgbouncer (pid #{pid}) was still running 10 s after its shutdown signal"
  rescue Errno::ENOENT, Errno::ESRCH
    nil
  end

  it "serves 2 processes x 10 threads of claims, duplicates and completions with zero errors" do
    url = "postgres://postgres@127.0.0.1:#{port}/idempotent_job"
    workers = Array.new(2) do |n|
      fork_worker do |pipe|
        SpecServices.configure_gem!(database_url: url, pool_size: 10, prepared_statements: false)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
        counts = Array.new(10) do |t|
          Thread.new do
            ops = 0
            errors = []
            while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
              key = "#{n}-#{t}-#{ops}"
              begin
                deliver_once("Bouncer", key) # claimed and completed
                raise "duplicate not turned away" unless deliver_once("Bouncer", key).decision == :completed
                raise "record not found" unless IdempotentJob.record("Bouncer", key)&.completed?

                ops += 1
              rescue StandardError => e
                errors << "#{e.class}: #{e.message}"
              end
            end
            [ops, errors]
          end
        end.map(&:value)
        pipe.puts(JSON.generate(ops: counts.sum(&:first), errors: counts.flat_map(&:last).uniq.first(5)))
      end
    end
    results = workers.map do |pid, reader|
      line = read_line(reader, timeout: seconds + 30)
      expect(wait_child(pid)).to be_success
      JSON.parse(line)
    end
    total = results.sum { |r| r["ops"] }
    puts "\n    PgBouncer soak: #{total} operations (claim, complete, duplicate, read) in #{seconds} s"
    expect(results.flat_map { |r| r["errors"] }).to eq([])
    expect(total).to be > 100
  end

  it "lets a wait: caller poll (no LISTEN through transaction pooling) and replay the running call's stored value" do
    url = "postgres://postgres@127.0.0.1:#{port}/idempotent_job"
    logged = StringIO.new
    SpecServices.configure_gem!(database_url: url, pool_size: 4, prepared_statements: false,
                                logger: Logger.new(logged))
    started = Queue.new
    finish = Queue.new
    runs = Queue.new
    charge = lambda do |**options, &body|
      IdempotentJob.perform_once("BouncerWait", 1, lease: 30, store_result: true, **options, &body)
    end
    holder = Thread.new do
      charge.call do
        started << true
        finish.pop
        runs << :holder
        { "charge_id" => "ch_b" }
      end
    end
    started.pop
    short = charge.call(wait: 0.2) { runs << :short }
    waiter = Thread.new { charge.call(wait: 30) { runs << :waiter } }
    sleep(0.01) until logged.string.include?("waiting up to 30.0 s") || !waiter.alive?
    finish << true
    holder.join
    expect(short).to have_attributes(decision: :in_progress)
    expect(waiter.value).to have_attributes(decision: :completed, replayed?: true, value: { "charge_id" => "ch_b" })
    expect(runs.size).to eq(1)
    # The waiter's path: polling, as the store's statement mode says (no LISTEN here).
    request = { job_type: "BouncerWait", operation_key: "1", lease: 30.0 }
    expect(IdempotentJob.store.wait(request, 0)[:wait_path]).to eq(:poll)
  end

  it "works with a Rails DATABASE_URL that says prepared_statements=false (and pool=) instead of the settings" do
    # What a Rails app behind PgBouncer already has: the gem honours the URL's
    # prepared_statements=false; without it the named statements fail here about half the time.
    url = "postgres://postgres@127.0.0.1:#{port}/idempotent_job?prepared_statements=false&pool=10&encoding=unicode"
    SpecServices.configure_gem!(database_url: url)
    expect(IdempotentJob.configuration.effective_pool_size).to eq(10)
    errors = Array.new(10) do |t|
      Thread.new do
        Array.new(50) do |i|
          key = "rails-url-#{t}-#{i}"
          deliver_once("BouncerUrl", key) # claimed and completed
          deliver_once("BouncerUrl", key).decision == :completed ? nil : "duplicate not turned away"
        rescue StandardError => e
          "#{e.class}: #{e.message}"
        end
      end
    end.flat_map(&:value).compact.uniq
    expect(errors).to eq([])
  end
end
