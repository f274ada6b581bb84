# frozen_string_literal: true

# Deliveries through Sidekiq's testing harness (the real server middleware chain),
# and workers that die at a named point of the job body.
module ReplayHelpers
  # A job payload as Sidekiq would deliver it, after its client middleware ran.
  # @return [Hash]
  def job_hash(args = [42, 1500], klass: ChargeOrderJob, **extra)
    klass.perform_async(*args)
    klass.jobs.pop.merge(extra.transform_keys(&:to_s))
  end

  def deliver(job, klass: Object.const_get(job["class"]))
    klass.process_job(job)
  end

  # Delivers the jobs at the same time, each on its own thread (released together), and
  # waits for them all.
  def deliver_at_once(*jobs)
    gate = Queue.new
    threads = jobs.map do |job|
      Thread.new do
        gate.pop
        deliver(job)
      ensure
        ActiveRecord::Base.connection_handler.clear_active_connections! if defined?(ActiveRecord::Base)
      end
    end
    jobs.size.times { gate << true }
    threads.each(&:join)
  end

  def record(key = "42", job_type: "ChargeOrderJob")
    IdempotentJob.record(job_type, key)
  end

  def without_middleware!
    Sidekiq::Testing.server_middleware(&:clear)
  end

  # Forks a worker that delivers `job`, blocks at `point` of the body and is SIGKILLed
  # there: a real process dying while it holds the claim.
  def kill_worker_at(point, job)
    pid, reader = fork_worker do |pipe|
      SpecHooks.on(point) do
        pipe.puts("at #{point}")
        sleep 60
      end
      deliver(job)
    end
    expect(read_line(reader)).to eq("at #{point}")
    kill9(pid)
  end

  # A holder stalls inside its body (after its effect) past its lease; another
  # delivery takes the claim over and completes; then the holder wakes up.
  # @return [Thread] the holder's thread, whose join raises what its delivery raised
  def stalled_holder_overtaken(job, stall: 0.4)
    holder_inside = Queue.new
    release_holder = Queue.new
    SpecHooks.on(:after_effect) do
      if Thread.current[:stalled]
        holder_inside << true
        release_holder.pop
      end
    end
    stalled = Thread.new do
      Thread.current[:stalled] = true
      deliver(job)
    end
    stalled.report_on_exception = false
    holder_inside.pop
    sleep stall
    deliver(job)
    release_holder << true
    stalled
  end

  # Two forked workers deliver `job` at once, released together by a barrier; the
  # body holds `hold` seconds after its effect so the deliveries overlap. Each child
  # reports the block's value (run after its delivery) on its pipe.
  # @return [Array<String>] the children's reports
  def race_processes(job, hold:, &report)
    gate_reader, gate_writer = IO.pipe
    children = 2.times.map do
      fork_worker do |pipe|
        gate_writer.close
        SpecHooks.on(:after_effect) { sleep hold }
        gate_reader.read(1) # the barrier: both start when the parent closes the gate
        deliver(job)
        pipe.puts(report.call)
      end
    end
    gate_reader.close
    sleep 0.2
    gate_writer.close
    children.map do |pid, reader|
      line = read_line(reader)
      expect(wait_child(pid)).to be_success
      line
    end
  end

  def wait_for_lease_end(lease)
    sleep lease + 0.2
  end
end

RSpec.configure { |config| config.include ReplayHelpers }
