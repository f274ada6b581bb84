# frozen_string_literal: true

module Demo
  # Waits until the worker has handled every delivery, then prints one row per operation
  # and the verdict: exactly one effect per operation.
  class Report
    CLASSES = %w[ChargeOrderJob CaptureOrderJob ShipParcelJob EmailReceiptJob LedgerEntryJob].freeze
    WAIT_TIMEOUT = 60
    LEGEND = <<~TEXT
      deliveries: jobs the demo enqueued; arrived: deliveries that reached a worker (a deferred one counts again
      when it comes back); effects: rows the job body wrote (for LedgerEntryJob: committed rows in demo_ledger,
      which has no unique constraint); attempts: claims made (each ran the body, except a takeover held under
      idempotency_on_stale: :hold; a claim rolled back with its transaction is not counted); duplicates: copies
      the record turned away (skipped as completed, or deferred behind a live claim), each counted once, when it
      first arrives: a deferred copy coming back is not counted again (README, "What duplicates counts"), so
      arrived is attempts + duplicates + the deferred copies' returns that were turned away again.
    TEXT

    def initialize(state, logs)
      @state = state
      @logs = logs
    end

    # @return [Boolean] true when every operation completed with exactly one effect
    def call
      started = Demo.monotonic
      handled = wait_until_idle
      puts format("all deliveries handled in %.1f s", Demo.monotonic - started) if handled
      puts log_summary unless @logs.empty?
      puts
      rows = @state.operations.map { |op| row(op) }
      puts table(rows), "", LEGEND
      notes(rows)
      ledger_ok = ledger_summary(rows)
      puts
      verdict(rows, handled) && ledger_ok
    end

    private

    def wait_until_idle
      print "waiting for every delivery to be handled (deferred ones come back when their lease ends)... "
      $stdout.flush
      idle_checks = 0
      Demo.wait_for(WAIT_TIMEOUT, "the demo's deliveries to be handled") do
        idle_checks = idle? ? idle_checks + 1 : 0
        sleep 0.3 if idle_checks == 1
        idle_checks >= 2
      end
      puts "done"
      true
    rescue Timeout::Error => e
      puts "TIMED OUT"
      warn e.message
      false
    end

    # Every record completed, no demo job queued, scheduled (deferred) or awaiting a retry,
    # and none in the hands of a live worker.
    def idle?
      @state.operations.all? { |op| op.record&.completed? } && pending_jobs.zero? && in_hand.zero?
    end

    def pending_jobs
      [Sidekiq::Queue.new("default"), Sidekiq::ScheduledSet.new, Sidekiq::RetrySet.new]
        .sum { |set| set.count { |job| CLASSES.include?(job.klass) } }
    end

    # Deliveries inside live workers' middleware (a killed worker's count is ignored).
    def in_hand
      Sidekiq.redis do |redis|
        # KEYS, not redis-rb's scan_each: the demo's keyspace is small, and KEYS is one
        # command on both redis-rb (Sidekiq 6) and redis-client (Sidekiq 7+).
        redis.keys("#{INFLIGHT_PREFIX}*").sum do |key|
          alive?(key.delete_prefix(INFLIGHT_PREFIX).to_i) ? redis.get(key).to_i : 0
        end
      end
    end

    def alive?(pid)
      Process.kill(0, pid)
      true
    rescue Errno::ESRCH
      false
    rescue Errno::EPERM
      true
    end

    def row(operation)
      record = operation.record
      effects = operation.effects.call(operation)
      {
        "scenario" => operation.scenario, "job type" => operation.job_class.name, "operation key" => operation.key,
        "deliveries" => @state.deliveries(operation.id), "arrived" => arrivals(operation), "effects" => effects.size,
        "status" => record&.status || "none", "attempts" => record&.attempts, "takeovers" => record&.takeovers,
        "duplicates" => record&.duplicates, effect_pids: effects, record:
      }
    end

    def arrivals(operation)
      Sidekiq.redis { |redis| redis.hget(ARRIVALS_KEY, operation.id) }.to_i
    end

    def table(rows)
      Table.lines(rows).join("\n")
    end

    # Every claim and every duplicate is an arrival; an arrival may be neither (a deferred copy
    # coming back and turned away again is not a new duplicate), so only fewer arrivals than
    # claims and duplicates is odd.
    def notes(rows)
      rows.each do |r|
        if r["attempts"] && r["arrived"] < r["attempts"] + r["duplicates"] + rolled_back(r).size
          puts "note: #{r["job type"]} #{r["operation key"]}: arrived #{r["arrived"]} < attempts + duplicates"
        end
        takeover_note(r) if r["takeovers"].to_i.positive?
      end
    end

    # @return [Array<Hash>] what a delivery of this operation killed before its commit saw inside its
    #   transaction (its claim was rolled back with it, so the record never counted it)
    def rolled_back(row)
      return [] unless row["job type"] == "LedgerEntryJob"

      [Uncommitted.find(row["operation key"])].compact
    end

    # The transactional ledger: per operation, the copies' times (h) and the killed worker's
    # rolled-back write (i); then the duplicate rows, which must be 0.
    # @return [Boolean] true when no order has more than one row and the killed worker left none
    def ledger_summary(rows)
      ledger = rows.select { |r| r["job type"] == "LedgerEntryJob" }
      ledger.each { |r| rolled_back(r).empty? ? copies_note(r) : rolled_back_note(r) }
      duplicate_rows = ledger.sum { |r| [r["effects"] - 1, 0].max }
      leftovers = ledger.sum { |r| rolled_back(r).sum { |seen| r[:effect_pids].count(seen["pid"]) } }
      total = ledger.sum { |r| r["effects"] }
      puts "transactional ledger: #{plural(ledger.size, "operation")}, #{plural(total, "row")}, " \
           "#{duplicate_rows} duplicate rows, #{leftovers} rows left by a worker killed before its commit"
      return true if duplicate_rows.zero? && leftovers.zero?

      puts "FAILED: the transactional ledger has #{duplicate_rows} duplicate rows and #{leftovers} rows of a " \
           "transaction that never committed"
      false
    end

    # (h): how long each copy spent in the worker. One ran the body and committed; the ones
    # that overlapped it waited on the record's row lock for that commit, then skipped.
    def copies_note(row)
      times = durations(row).sort.reverse
      return if times.empty?

      waited, later = times.drop(1).partition { |t| t >= WORK_SECONDS / 2 }
      text = "(h) LedgerEntryJob #{row["operation key"]}: #{times.size} copies; 1 ran the body and committed " \
             "(#{seconds(times.first)}), #{waited.size} waited on the record's row lock for that commit " \
             "(#{seconds(*waited.minmax)}), then skipped it as completed"
      text += ", #{later.size} came after the commit and skipped at once" unless later.empty?
      puts "#{text}; #{row["arrived"] - row["deliveries"]} deferred; #{plural(row["effects"], "row")}, " \
           "by pid #{row[:effect_pids].join(", ")}"
    end

    # (i): the killed worker's write is not in the table; the redelivery's is.
    def rolled_back_note(row)
      seen = rolled_back(row).first
      record = row[:record]
      left = row[:effect_pids].count(seen["pid"])
      puts "(i) LedgerEntryJob #{row["operation key"]}: pid #{seen["pid"]} wrote a row in its transaction " \
           "(it saw #{plural(seen["rows"], "row")} and its record #{seen["status"]}) and was SIGKILLed before " \
           "commit: it left #{plural(left, "row")}; the redelivery claimed it as attempt " \
           "#{record&.attempts} (#{record&.last_claim}) and committed; rows in the table: " \
           "#{plural(row["effects"], "row")}, by pid #{row[:effect_pids].join(", ")}"
    end

    def durations(row)
      id = "#{row["job type"]} #{row["operation key"]}"
      Sidekiq.redis { |redis| redis.lrange("#{DURATIONS_PREFIX}#{id}", 0, -1) }.map(&:to_f)
    end

    def plural(count, word)
      "#{count} #{word}#{"s" unless count == 1}"
    end

    def seconds(*values)
      shown = values.compact.map { |v| format("%.2f", v) }.uniq
      shown.empty? ? "-" : "#{shown.join("–")} s"
    end

    def takeover_note(row)
      record = row[:record]
      head = "#{row["scenario"][0, 3]} #{row["job type"]} #{row["operation key"]}:"
      pids = row[:effect_pids].join(", ")
      unless record.held_at
        puts "#{head} its effect was written by pid #{pids}, after taking over the claim of the killed worker"
        return
      end
      resolved = "not resolved"
      resolved = "resolved as #{record.resolution} at #{record.resolved_at.strftime("%T")}" if record.resolution
      puts "#{head} its effect was written by pid #{pids} before that worker was killed; after the lease the " \
           "redelivery took over the stale claim and held it at #{record.held_at.strftime("%T")} (not run again); " \
           "#{resolved} by rake idempotent_job:resolve"
    end

    def log_summary
      text = @logs.select { |log| File.exist?(log) }.map { |log| File.read(log) }.join
      counts = {
        "skipped as already completed" => text.scan(/already completed; duplicate delivery skipped/).size,
        "deferred behind a live claim" => text.scan(/delivery deferred by/).size,
        "took over a stale claim to run it" => text.scan(/took over the stale claim/).size,
        "took over a stale claim to hold it" => text.scan(/is stale \(.*\): held for a person/).size
      }
      errors = text.lines.grep(/ (ERROR|FATAL): /)
      summary = "worker logs: #{counts.map { |what, n| "#{n} #{what}" }.join(", ")}"
      errors.empty? ? summary : "#{summary}\nERROR lines in the worker logs:\n#{errors.first(10).join}"
    end

    def verdict(rows, handled)
      bad = rows.reject { |r| r["effects"] == 1 && r["status"] == :completed }
      if bad.empty? && handled
        puts "all #{rows.size} operations: effects = 1 each"
        return true
      end
      bad.each do |r|
        puts "FAILED: #{r["job type"]} #{r["operation key"]}: effects = #{r["effects"]}, status #{r["status"]}"
      end
      puts "FAILED: #{bad.size} of #{rows.size} operations did not end with exactly one effect" unless bad.empty?
      puts "FAILED: the deliveries were not all handled within #{WAIT_TIMEOUT} s" unless handled
      false
    end
  end
end
