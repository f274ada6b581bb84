# frozen_string_literal: true

require "rake"

# Rake tasks of the gem. In a plain Rakefile: `require "idempotent_job/rake_tasks"`;
# in Rails the Railtie loads them (and they run after the :environment task).
# Connection settings come from the environment (IDEMPOTENT_JOB_DATABASE_URL, then
# DATABASE_URL) unless the app configured the gem; `resolve ... rerun` enqueues with
# the queue's own settings (REDIS_URL). The native library is loaded only when a task
# runs, not when the Rakefile is read.
namespace :idempotent_job do
  prerequisites = Rake::Task.task_defined?(:environment) ? [:environment] : []

  # A task argument or environment variable as a Float; one line naming it, no backtrace,
  # when it is not a number.
  number = lambda do |text, name, unit|
    Float(text)
  rescue ArgumentError, TypeError
    abort %(idempotent_job: #{name} must be a number of #{unit}, got #{text.inspect})
  end

  desc "Create or update the idempotency record table (applies migrations/ in order; safe to run twice)"
  task migrate: prerequisites do
    require "idempotent_job"
    applied = IdempotentJob.migrate!
    if applied.empty?
      puts "idempotent_job: schema is up to date"
    else
      applied.each { |name| puts "idempotent_job: applied #{name}" }
    end
  end

  desc "Print the schema SQL of every migration (for teams that manage migrations themselves)"
  task :sql do
    require "idempotent_job"
    puts IdempotentJob.schema_sql
  end

  desc "Delete completed and given-up records older than OLDER_THAN seconds (default: the configured " \
       "retention), in batches"
  task :purge, [:older_than] => prerequisites do |_task, args|
    require "idempotent_job"
    older_than = args[:older_than] || ENV.fetch("OLDER_THAN", nil)
    older_than = older_than ? number.call(older_than, "OLDER_THAN", "seconds") : IdempotentJob.configuration.retention
    tty = $stdout.tty?
    # Progress on a terminal only: a log (cron, CI) gets the final count alone.
    begin
      total = IdempotentJob.purge(older_than:) { |so_far| print("\ridempotent_job: purged #{so_far}…") if tty }
    rescue IdempotentJob::ConfigurationError => e # a negative OLDER_THAN: one line, no backtrace
      abort "idempotent_job: #{e.message}"
    end
    puts if tty && total.positive?
    puts "idempotent_job: purged #{total} records finished more than #{older_than} s ago"
  end

  desc "Report operations delivered more than once in the last HOURS hours (default 24): each repeat classified " \
       "(concurrent copy, queue retry, redelivery/restart, re-enqueue by the same or another producer), per job " \
       "type and per pair of producers, then the SQL it ran (RESTARTS=iso8601,…, RESTART_WINDOW=seconds, default " \
       "120; CSV=path also writes one row per repeat)"
  task :repeats, [:hours] => prerequisites do |_task, args|
    require "idempotent_job"
    require "time"
    hours = number.call(args[:hours] || ENV.fetch("HOURS", "24"), "HOURS", "hours")
    restarts = ENV.fetch("RESTARTS", "").split(",").map do |t|
      Time.iso8601(t.strip)
    rescue ArgumentError
      abort %(idempotent_job: RESTARTS must be ISO 8601 times separated by commas, got #{t.inspect})
    end
    window = number.call(ENV.fetch("RESTART_WINDOW", "120"), "RESTART_WINDOW", "seconds")
    report = IdempotentJob::Repeats.report(since: Time.now - (hours * 3600), restarts:, restart_window: window)
    puts report.lines
    puts "idempotent_job: no repeated operations in the last #{hours} hours" if report.operations.empty?
    if (path = ENV.fetch("CSV", nil))
      File.write(path, report.to_csv)
      puts "idempotent_job: #{report.operations.sum { |op| op.repeats.size }} repeats written to #{path}"
    end
    puts "-- the SQL behind this report ($1 since, $2 job type or NULL):", IdempotentJob.repeats_sql.strip
  end

  desc "List operations held for a person (stale claims under idempotency_on_stale: :hold)"
  task :held, [:job_type] => prerequisites do |_task, args|
    require "idempotent_job"
    held = IdempotentJob.held(job_type: args[:job_type] || ENV.fetch("JOB_TYPE", nil), limit: 1000)
    if held.empty?
      puts "idempotent_job: no held operations"
      next
    end
    rows = held.map do |r|
      [r.job_type, r.operation_key, r.held_at&.utc&.strftime("%F %T UTC"), r.attempts.to_s, r.jid.to_s]
    end
    rows.unshift(["job type", "operation key", "held since", "attempts", "last jid"])
    widths = rows.transpose.map { |column| column.map(&:size).max }
    rows.each { |row| puts row.zip(widths).map { |cell, width| cell.ljust(width) }.join("  ").rstrip }
    puts "idempotent_job: #{held.size} held; settle one with rake idempotent_job:resolve[JOB_TYPE,KEY,done|rerun]"
  end

  desc "Settle a held operation: idempotent_job:resolve[JOB_TYPE,KEY,done|rerun] " \
       "(or JOB_TYPE=… KEY=… AS=… for keys with commas)"
  task :resolve, %i[job_type operation_key as] => prerequisites do |_task, args|
    require "idempotent_job"
    job_type = args[:job_type] || ENV.fetch("JOB_TYPE", nil)
    key = args[:operation_key] || ENV.fetch("KEY", nil)
    as = args[:as] || ENV.fetch("AS", nil)
    abort "usage: rake idempotent_job:resolve[JOB_TYPE,KEY,done|rerun]" unless job_type && key && as

    # A rerun is enqueued by a loaded door; a plain Rakefile loads none, so the
    # door of the installed queue library is loaded (idempotent_job/sidekiq).
    if as.to_s == "rerun" && IdempotentJob::Door.registered.empty?
      begin
        require "idempotent_job/sidekiq"
      rescue LoadError
        nil
      end
    end
    begin
      record = IdempotentJob.resolve(job_type, key, as:)
    rescue IdempotentJob::Error => e # no record, not held: one line, no backtrace
      abort "idempotent_job: #{e.message}"
    end
    puts "idempotent_job: #{record.job_type} operation #{record.operation_key.inspect} resolved as #{as}: " \
         "now #{record.status}"
  end
end
