# frozen_string_literal: true

module IdempotentJob
  # Watches the lease heartbeats of the jobs running in this process from one
  # background thread, so a renewal that fails (a dead network, a read-only failover,
  # a table without heartbeat_at) is logged and published as a `heartbeat_failed`
  # event while the job still runs, not only when it ends. The thread sleeps in the
  # core (`Native.heartbeat_alarm`, the GVL released) until the core's heartbeat timer
  # tells it a renewal failed: no polling, no wake-up while renewals succeed. The job
  # itself can ask {Claim#in_doubt?}. Doors call {watch} when a heartbeat starts and
  # {stop} instead of stopping the heartbeat themselves.
  module HeartbeatWatch
    @watched = {}
    @lock = Mutex.new
    @thread = nil
    @pid = nil

    class << self
      # Starts watching a heartbeat and links it to its claim ({Claim#in_doubt?}).
      # @param heartbeat [Native::HeartbeatReader] the core's reader of the running heartbeat
      # @param claim [Claim] the claim it renews
      # @return [Native::HeartbeatReader] the heartbeat
      def watch(heartbeat, claim)
        claim.heartbeat = heartbeat
        @lock.synchronize do
          @watched[heartbeat] = [claim, 0]
          start_thread
        end
        heartbeat
      end

      # Stops watching a heartbeat whose body ended, reporting any failure not reported yet.
      # @param heartbeat [Native::HeartbeatReader]
      # @param report [Hash, nil] the final report the core handed over when it stopped
      #   renewing (nil: read it now)
      # @return [Hash] the heartbeat's final report (renewals, lost, max_run_reached,
      #   last_error, failures, since_confirmed, in_doubt)
      def stop(heartbeat, report = nil)
        report ||= heartbeat.report
        claim, seen = @lock.synchronize { @watched.delete(heartbeat) }
        announce(claim, report, seen) if claim
        report
      end

      private

      def start_thread
        return if @thread&.alive? && @pid == Process.pid

        @pid = Process.pid
        @thread = Thread.new do
          Thread.current.name = "idempotent_job heartbeat watch"
          Thread.current.report_on_exception = false
          rings = 0
          loop do
            # Returns when a renewal failed since `rings` (at once the first time
            # after a failure before the thread started, or in a forked child).
            rings = Native.heartbeat_alarm(rings)
            look
          end
        end
      end

      def look
        @lock.synchronize { @watched.to_a }.each do |heartbeat, (claim, seen)|
          report = heartbeat.report
          next unless report[:failures] > seen

          @lock.synchronize { @watched[heartbeat] = [claim, report[:failures]] if @watched.key?(heartbeat) }
          announce(claim, report, seen)
        end
      rescue StandardError => e
        IdempotentJob.logger.error("idempotent_job: the heartbeat watch failed: #{e.class}: #{e.message}")
      end

      # Logs and publishes the renewals that failed since `seen` were reported.
      def announce(claim, report, seen)
        return unless report[:failures] > seen

        IdempotentJob.logger.error(
          "idempotent_job: the lease of #{claim.job_type} operation #{claim.operation_key.inspect} (jid " \
          "#{claim.jid}, attempt #{claim.attempt}) could not be renewed (#{report[:failures]} failed " \
          "renewal(s), last: #{report[:last_error]}); #{doubt(report)}"
        )
        Events.publish(:heartbeat_failed, { job_type: claim.job_type, operation_key: claim.operation_key,
                                            jid: claim.jid, attempt: claim.attempt, failures: report[:failures],
                                            error: report[:last_error], in_doubt: report[:in_doubt] })
      end

      def doubt(report)
        return "the claim is still renewed" unless report[:in_doubt]

        "the claim is in doubt: last confirmed #{report[:since_confirmed].round(1)} s ago; once the lease " \
          "runs out another delivery may take the operation over"
      end
    end
  end
end
