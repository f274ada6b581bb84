# frozen_string_literal: true

require "sidekiq"
require_relative "jobs"
require_relative "journal"

module Soak
  # A fetch for the soak's workers that keeps each job it hands out in a list of its
  # own worker ("soak:working:<worker id>") until the job is acknowledged. Sidekiq 6.4's
  # basic fetch removes a job from Redis when it hands it out, so a SIGKILLed worker
  # loses the deliveries it had in hand; a producer then has to notice and enqueue them
  # again. Here the driver does that, exactly: after each kill it moves the dead worker's
  # list back to the queue ({recover}), as Sidekiq Pro's super_fetch would, and the report
  # counts those deliveries. Written against Sidekiq 6.4's fetch interface
  # (`retrieve_work`, `bulk_requeue`, a unit of work with `acknowledge`, `queue_name`,
  # `requeue`, `job`).
  class ReliableFetch
    # Seconds a fetch blocks before the thread checks for a shutdown.
    TIMEOUT = 2
    # Prefix of each worker's in-hand list.
    WORKING_PREFIX = "soak:working:"

    # One job in hand: acknowledged (removed from the worker's list) once processed.
    UnitOfWork = Struct.new(:queue, :job, :working) do
      # @return [void]
      def acknowledge
        ::Sidekiq.redis { |redis| redis.lrem(working, -1, job) }
      end

      # @return [String]
      def queue_name
        queue.delete_prefix("queue:")
      end

      # Back to the front of the queue (a graceful shutdown that could not finish it).
      # @return [void]
      def requeue
        ::Sidekiq.redis do |redis|
          redis.multi do |transaction|
            transaction.rpush(queue, job)
            transaction.lrem(working, -1, job)
          end
        end
      end
    end

    # @param worker_id [String]
    # @return [String] the Redis list of jobs the worker has in hand
    def self.working_key(worker_id)
      "#{WORKING_PREFIX}#{worker_id}"
    end

    # Moves every job a dead worker had in hand back to the front of the queue.
    # Call only once the worker's process is gone.
    # @param worker_id [String]
    # @return [Array<String>] the jobs moved (JSON payloads)
    def self.recover(worker_id)
      working = working_key(worker_id)
      ::Sidekiq.redis do |redis|
        moved = []
        while (job = redis.lmove(working, "queue:#{QUEUE}", "RIGHT", "RIGHT"))
          moved << job
        end
        moved
      end
    end

    # @return [Integer] jobs in the hands of the given workers
    def self.in_hand(worker_ids)
      ::Sidekiq.redis { |redis| worker_ids.sum { |id| redis.llen(working_key(id)) } }
    end

    # @param source [Hash, Object] Sidekiq 6.4's options Hash, or Sidekiq 7's capsule
    #   (its queues: the soak uses one queue)
    def initialize(source)
      queues = source.respond_to?(:queues) ? source.queues : source[:queues]
      @queue = "queue:#{Array(queues).first || QUEUE}"
      @working = self.class.working_key(Soak.worker_id)
    end

    # @return [UnitOfWork, nil] the next job, nil after {TIMEOUT} seconds without one
    def retrieve_work
      job = ::Sidekiq.redis do |redis|
        # redis-client (Sidekiq 7+) blocks through blocking_call; redis-rb takes a timeout: keyword.
        if redis.respond_to?(:blocking_call)
          redis.blocking_call(TIMEOUT + 1, "BLMOVE", @queue, @working, "RIGHT", "LEFT", TIMEOUT)
        else
          redis.blmove(@queue, @working, "RIGHT", "LEFT", timeout: TIMEOUT)
        end
      end
      job && UnitOfWork.new(@queue, job, @working)
    end

    # Sidekiq's graceful shutdown: the jobs that did not finish go back to the queue.
    # @param inprogress [Array<UnitOfWork>]
    # @param _options [Hash] (Sidekiq 6.4 passes its options; 7 passes nothing)
    # @return [void]
    def bulk_requeue(inprogress, _options = nil)
      inprogress.each(&:requeue)
    end
  end

  # Outermost server middleware of the soak's workers: counts deliveries, and journals a
  # delivery that failed (its error, and whether its body had made the outside effect)
  # and a body that made its effect but whose completion was not recorded (the gem logs
  # and goes on when PostgreSQL is unreachable at that moment; the record then stays
  # claimed until its lease ends).
  class Observer
    # @param _job_instance [Object]
    # @param job_hash [Hash] Sidekiq's payload
    # @param _queue [String]
    # @yield the rest of the chain (the gem's middleware, then the body)
    # @return [Object] the chain's value
    def call(_job_instance, job_hash, _queue)
      return yield unless JOB_TYPES.key?(job_hash["class"])

      Thread.current[:soak_events] = []
      Thread.current[:soak_effect] = nil
      Journal.count("arrived")
      result = yield
      unrecorded_completion(job_hash) if Thread.current[:soak_effect] && !event?(:completed)
      result
    rescue StandardError => e
      Journal.write("failed", reference: reference(job_hash), jid: job_hash["jid"], error: e.class.name,
                              message: e.message[0, 300], effect: Thread.current[:soak_effect])
      raise
    end

    private

    def event?(name)
      Array(Thread.current[:soak_events]).include?(name)
    end

    def unrecorded_completion(job_hash)
      Journal.write("unrecorded_completion", reference: reference(job_hash), jid: job_hash["jid"],
                                             **Thread.current[:soak_effect])
    end

    def reference(job_hash)
      Soak.reference(job_hash["class"], job_hash["args"].first)
    end
  end
end
