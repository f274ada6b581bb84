# frozen_string_literal: true

# A real Delayed Job worker process for the ActiveJob specs (`ruby
# spec/support/delayed_job_worker.rb`), on the suite's PostgreSQL: the spec jobs on
# ActiveJob's :delayed_job adapter. DJ_MAX_RUN_TIME (seconds) is how long a job a dead
# worker had locked stays locked before another worker picks it up again.
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require_relative "services"
require_relative "effects"
require_relative "active_job_jobs"
require_relative "delayed_job_setup"

ActiveRecord::Base.establish_connection(SpecServices.active_record_url)
ActiveJob::Base.queue_adapter = :delayed_job
IdempotentJob.configure do |c|
  c.database_url = SpecServices.database_url
  c.logger = Logger.new($stderr, level: Logger::INFO)
end
Delayed::Worker.logger = Logger.new($stderr, level: Logger::INFO)
Delayed::Worker.max_run_time = Float(ENV.fetch("DJ_MAX_RUN_TIME", "3"))
Delayed::Worker.max_attempts = 5
# DJ_RAISE_SIGNAL_EXCEPTIONS=term: a TERM raises SignalException inside the running job
# (Delayed Job's option for workers that must stop at once), instead of letting it finish.
Delayed::Worker.raise_signal_exceptions = ENV["DJ_RAISE_SIGNAL_EXCEPTIONS"]&.to_sym
$stdout.sync = true
puts "ready #{Process.pid}"
Delayed::Worker.new(sleep_delay: 0.1, quiet: true).start
