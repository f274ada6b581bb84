# frozen_string_literal: true

# The demo's producer and reporter: a process of its own, apart from the Sidekiq worker.
#
#   ruby examples/demo/driver.rb setup     # demo tables, a new run
#   ruby examples/demo/driver.rb crash     # enqueue (d) (g) (i); return once a worker is inside each
#   ruby examples/demo/driver.rb enqueue   # enqueue (d) (g) (i) again, and (a) (b) (c) (e) (f) (h) (j)
#   ruby examples/demo/driver.rb email-key # print the operation key of (g)
#   ruby examples/demo/driver.rb held      # wait until (g) is held; exit 1 if it is not
#   ruby examples/demo/driver.rb check-email [KILLED_PID]  # a person's check of (g); exit 1 if unexpected
#   ruby examples/demo/driver.rb report [SIDEKIQ_LOG...]  # wait, print the table; exit 1 on a failure
#   ruby examples/demo/driver.rb repeats [RESTART_ISO8601...]  # each scenario's repeats, as classified
#
# Needs DATABASE_URL and REDIS_URL. The steps share DEMO_STATE (default tmp/demo/state.json).
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "timeout"
require "sidekiq"
Redis.silence_deprecations = true if defined?(Redis) && Redis.respond_to?(:silence_deprecations=)
require "sidekiq/api"
require "idempotent_job/sidekiq"
require_relative "jobs"
require_relative "state"
require_relative "producer"
require_relative "operator"
require_relative "report"
require_relative "repeats_table"
require_relative "app/orders_controller"
require_relative "app/stripe_webhook"

IdempotentJob.configure { |c| c.database_url = ENV.fetch("DATABASE_URL") }

# Helpers of the demo's steps.
module Demo
  module_function

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Calls the block every 0.2 s until it returns a truthy value, which it returns.
  # @raise [Timeout::Error] after timeout seconds
  def wait_for(timeout, what)
    deadline = monotonic + timeout
    loop do
      result = yield
      return result if result
      raise Timeout::Error, "timed out after #{timeout} s waiting for #{what}" if monotonic > deadline

      sleep 0.2
    end
  end
end

begin
  case ARGV.first
  when "setup"
    Demo::Effects.create_tables
    # In-hand counts that killed workers of earlier runs left behind (their pids may be reused).
    Sidekiq.redis { |redis| redis.keys("#{Demo::INFLIGHT_PREFIX}*").each { |key| redis.del(key) } }
    state = Demo::State.start
    puts "demo tables ready (demo_charges, demo_shipments, demo_emails, demo_ledger); run tag #{state.run} " \
         "(order numbers #{state.run}-1xx)"
  when "crash" then Demo::Producer.new(Demo::State.load).crash
  when "enqueue" then Demo::Producer.new(Demo::State.load).enqueue
  when "email-key" then puts Demo::State.load.email.key
  when "held" then exit(Demo::Operator.new(Demo::State.load).wait_held ? 0 : 1)
  when "check-email" then exit(Demo::Operator.new(Demo::State.load).check_email(ARGV[1]&.to_i) ? 0 : 1)
  when "report" then exit(Demo::Report.new(Demo::State.load, ARGV.drop(1)).call ? 0 : 1)
  when "repeats"
    restarts = ARGV.drop(1).map { |t| Time.iso8601(t) }
    puts Demo::RepeatsTable.new(Demo::State.load, restarts:).lines
  else
    warn "usage: #{$PROGRAM_NAME} setup | crash | enqueue | email-key | held | check-email [KILLED_PID] | " \
         "report [SIDEKIQ_LOG...] | repeats [RESTART_ISO8601...]"
    exit 2
  end
rescue Interrupt
  puts
  exit 130
end
