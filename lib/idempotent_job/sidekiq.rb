# frozen_string_literal: true

require "sidekiq"
require "idempotent_job"

module IdempotentJob
  # Sidekiq integration: `require "idempotent_job/sidekiq"` adds {ServerMiddleware} to
  # the server chain and {ClientMiddleware} to the client chains. Written against the
  # middleware API shared by Sidekiq 6.4 to 8.x (plain classes with `call`).
  module Sidekiq
    # The idempotency options of one job, read from the job hash (where Sidekiq merges
    # `sidekiq_options` at enqueue, and `set(...)` overrides) and then from the class,
    # then from {IdempotentJob.configuration}.
    class Options
      # Answers an `idempotency_lookup` method may give.
      LOOKUP_ANSWERS = %i[done not_done unknown].freeze

      # @return [String] the job type stored in the record
      attr_reader :scope
      # @return [Numeric] lease in seconds
      attr_reader :lease
      # @return [IdempotentJob::Key] the resolved key declaration
      attr_reader :key
      # @return [Symbol] :reclaim, :hold or :skip
      attr_reader :on_stale
      # @return [Symbol] :log or :raise
      attr_reader :on_mismatch
      # @return [Symbol, nil] the job method asked about a stale claim
      attr_reader :lookup
      # @return [Boolean] renew the lease while the body runs
      attr_reader :heartbeat
      # @return [Numeric] seconds after which renewing stops
      attr_reader :max_run
      # @return [Symbol, nil] :native, :active_record, or nil (not transactional)
      attr_reader :transaction
      # @return [Numeric] seconds a transactional claim waits for another delivery
      attr_reader :lock_timeout

      # @param job_class [Class, String] the job class (or its name if not loadable)
      # @param job_hash [Hash] Sidekiq's job payload
      # @return [Options, nil] nil for jobs without `idempotency_key` (passed through)
      # @raise [OperationKeyError] for a malformed key declaration
      # @raise [ConfigurationError] for a bad lease, scope, policy or lookup
      def self.resolve(job_class, job_hash)
        declaration = option(job_class, job_hash, "idempotency_key")
        declaration.nil? ? nil : new(job_class, job_hash, declaration)
      end

      # @return [Object, nil] the option from the job hash, else from the class
      def self.option(job_class, job_hash, name)
        return job_hash[name] if job_hash.key?(name)
        return nil unless job_class.respond_to?(:get_sidekiq_options)

        job_class.get_sidekiq_options[name]
      end

      def initialize(job_class, job_hash, declaration)
        @job_class = job_class
        @job_hash = job_hash
        @name = job_class.is_a?(Class) ? job_class.name : job_class.to_s
        @key = Key.for(job_class, declaration)
        config = IdempotentJob.configuration
        @lease = Configuration.positive_seconds!("idempotency_lease", fetch("lease", config.lease), job: @name)
        @scope = fetch("scope", @name).to_s
        raise ConfigurationError, "#{@name}: idempotency_scope must not be empty" if @scope.empty?

        resolve_policies(config)
      end

      private

      def fetch(name, default)
        value = self.class.option(@job_class, @job_hash, "idempotency_#{name}")
        value.nil? ? default : value
      end

      def transaction_flavour(value)
        case value
        when true, "true", :native, "native" then :native
        when :active_record, "active_record" then :active_record
        when false, nil, "false" then nil
        else
          raise ConfigurationError, "#{@name}: idempotency_transaction must be true, :active_record or false, " \
                                    "got #{value.inspect}"
        end
      end

      def resolve_policies(config)
        @on_stale = Configuration.choice!("idempotency_on_stale", fetch("on_stale", config.on_stale),
                                          Configuration::STALE_POLICIES, job: @name)
        @on_mismatch = Configuration.choice!("idempotency_on_mismatch", fetch("on_mismatch", config.on_mismatch),
                                             Configuration::MISMATCH_POLICIES, job: @name)
        @heartbeat = ![false, "false", nil].include?(fetch("heartbeat", config.heartbeat))
        @max_run = Configuration.positive_seconds!("idempotency_max_run", fetch("max_run", config.max_run), job: @name)
        @transaction = transaction_flavour(fetch("transaction", false))
        @lock_timeout = Configuration.pg_timeout!("idempotency_lock_timeout",
                                                  fetch("lock_timeout", config.lock_timeout), job: @name)
        @lookup = fetch("lookup", nil)&.to_sym
        return if @lookup.nil? || !@job_class.is_a?(Class) || @job_class.method_defined?(@lookup)

        raise ConfigurationError, "#{@name}: idempotency_lookup names ##{@lookup}, which #{@name} does not define"
      end
    end

    # Server middleware: claims the operation before the job body runs.
    #
    # For each delivery of a job that declares `idempotency_key`, one statement decides:
    # * first delivery, or a retry after the body raised: run the body, then mark the
    #   record completed;
    # * already completed, held or given up: do not run; the record's `duplicates` is counted;
    # * claimed by another delivery whose lease is live: do not run now; the delivery is
    #   pushed back to arrive when that lease ends, so it is never lost;
    # * claimed, lease expired (a stale claim): this delivery takes the claim over; the
    #   job's `idempotency_lookup` is asked, then the stale policy applies (:reclaim runs
    #   the body, :hold holds the operation for a person, :skip gives it up).
    # While the body runs a heartbeat renews the lease. If the body raises, the claim is
    # released and the exception re-raised (Sidekiq's retry runs it again), except on
    # Sidekiq::Shutdown, where the claim is kept for the lease to decide.
    # Reads and writes `idempotent_job_records`.
    class ServerMiddleware
      # Longest error text stored in `last_error`.
      ERROR_TEXT_LIMIT = 1000
      # Seconds to wait before each new attempt to record a completion after a
      # connection error (the body has run: its completion is worth a short wait).
      COMPLETION_RETRY_DELAYS = [0.05, 0.25, 1.0].freeze

      # @param job_instance [Object] the job object Sidekiq built
      # @param job_hash [Hash] the job payload ("class", "args", "jid", options…)
      # @param _queue [String] queue name
      # @yield runs the rest of the chain and the job body
      # @return [Object] the block's value, or nil when the delivery was not run
      # @raise [OperationKeyError] when the arguments yield no operation key (body not run)
      # @raise [ConnectionError, DatabaseError] when the claim cannot be decided (body not run)
      # @raise [PayloadMismatchError] for a mismatched payload under `on_mismatch: :raise`
      # @raise [LookupError] when the stale-claim lookup fails (body not run)
      # @raise [LostClaimError] when the body ran but its claim had been taken over
      def call(job_instance, job_hash, _queue, &)
        options = Options.resolve(job_instance.class, job_hash)
        return yield unless options

        key = options.key.operation_key(job_hash["args"])
        return transactional(job_instance, options, key, job_hash, &) if options.transaction

        decision = timed { IdempotentJob.store.claim(claim_request(options, key, job_hash)) }
        mismatch!(options, key, job_hash, decision) if decision[:mismatch]
        case decision[:decision]
        when :claimed then claimed(job_instance, options, key, job_hash, decision, &)
        when :in_progress then defer(options.scope, key, job_hash, decision)
        else skip(options.scope, key, job_hash, decision)
        end
      end

      private

      def claim_request(options, key, job_hash)
        args = job_hash["args"]
        { job_type: options.scope, operation_key: key, jid: job_hash["jid"], lease: options.lease.to_f,
          args_digest: ArgsDigest.of(args), job_class: job_hash["class"].to_s, queue: job_hash["queue"],
          args_json: JSON.generate(args), refuse_mismatch: options.on_mismatch == :raise }
      end

      def store
        IdempotentJob.store
      end

      # Runs the block (a claim) and adds its duration in seconds to the decision.
      def timed
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        yield.merge(duration: Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      end

      # Publishes an event about a claim (or a delivery without one).
      def emit(name, claim, **details)
        Events.publish(name, { job_type: claim.job_type, operation_key: claim.operation_key, jid: claim.jid,
                               attempt: claim.attempt, **details })
      end

      def emit_delivery(name, scope, key, job_hash, **details)
        Events.publish(name, { job_type: scope, operation_key: key, jid: job_hash["jid"], **details })
      end

      def logger
        IdempotentJob.logger
      end

      def describe(scope, key, job_hash, attempt = nil)
        "#{scope} operation #{key.inspect} (jid #{job_hash["jid"]}#{", attempt #{attempt}" if attempt})"
      end

      def mismatch!(options, key, job_hash, decision)
        text = "#{describe(options.scope, key, job_hash)} was delivered with arguments that differ from " \
               "those of its claim (same operation key, different payload)"
        refused = options.on_mismatch == :raise && decision[:decision] != :claimed
        emit_delivery(:mismatch, options.scope, key, job_hash, refused:)
        if refused
          logger.error("idempotent_job: #{text}; delivery refused")
          raise PayloadMismatchError, "#{text}; refused (idempotency_on_mismatch: :raise), the job was not run"
        end
        logger.warn("idempotent_job: #{text}")
      end

      def claimed(job_instance, options, key, job_hash, decision, &)
        claim = new_claim(job_instance, options, key, job_hash, decision)
        IdempotentJob.with_claim(claim) do
          return nil if claim.kind == :takeover && !run_after_takeover?(job_instance, options, claim, store)

          log_retry(claim) if claim.kind == :retry
          run_claimed(options, claim, &)
        end
      end

      def new_claim(job_instance, options, key, job_hash, decision)
        job_instance.class.include(IdempotentJob::Job) unless job_instance.is_a?(IdempotentJob::Job)
        claim = Claim.new(job_type: options.scope, operation_key: key, token: decision[:token],
                          attempt: decision[:attempt], kind: decision[:kind], jid: job_hash["jid"])
        emit(:claimed, claim, kind: claim.kind, duration: decision[:duration])
        emit(:taken_over, claim) if claim.kind == :takeover
        claim
      end

      # Claim, body and completion in one transaction (`idempotency_transaction:`).
      # The body raising rolls everything back: nothing is recorded, Sidekiq retries.
      def transactional(job_instance, options, key, job_hash, &)
        flavour = options.transaction == :active_record ? Transactional::ActiveRecord : Transactional::Native
        flavour.within do |tx|
          decision = timed { tx.claim(claim_request(options, key, job_hash), options.lock_timeout) }
          mismatch!(options, key, job_hash, decision) if decision[:mismatch]
          case decision[:decision]
          when :claimed then claimed_in(tx, job_instance, options, new_claim(job_instance, options, key, job_hash,
                                                                             decision), &)
          when :in_progress then defer(options.scope, key, job_hash, decision)
          else skip(options.scope, key, job_hash, decision)
          end
        end
      end

      def claimed_in(transaction, job_instance, options, claim)
        IdempotentJob.with_claim(claim) do
          next nil if claim.kind == :takeover && !run_after_takeover?(job_instance, options, claim, transaction)

          IdempotentJob.with_transaction(transaction.handle) do
            started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
            result = yield
            fenced(:complete, claim, via: transaction)
            emit(:completed, claim, duration: Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
            result
          end
        end
      end

      def log_retry(claim)
        logger.info("idempotent_job: claimed #{describe_claim(claim)} again after a failure")
      end

      def describe_claim(claim)
        "#{claim.job_type} operation #{claim.operation_key.inspect} (jid #{claim.jid}, attempt #{claim.attempt})"
      end

      # A stale claim was taken over: ask the lookup, then apply the policy.
      # @return [Boolean] whether the body runs
      def run_after_takeover?(job_instance, options, claim, via)
        answer = options.lookup ? ask_lookup(job_instance, options, claim, via) : :unknown
        case answer
        when :done
          fenced(:complete, claim, via:)
          logger.warn("idempotent_job: took over the stale claim of #{describe_claim(claim)}; lookup " \
                      "##{options.lookup} says it is done: marked completed, not run")
          false
        when :not_done
          logger.warn("idempotent_job: took over the stale claim of #{describe_claim(claim)}; lookup " \
                      "##{options.lookup} says it is not done: running it")
          true
        else apply_stale_policy(options, claim, via)
        end
      end

      def apply_stale_policy(options, claim, via)
        why = options.lookup ? "lookup ##{options.lookup} does not know" : "its holder's lease ran out"
        case options.on_stale
        when :hold
          fenced(:hold, claim, via:)
          emit(:held, claim)
          logger.warn("idempotent_job: #{describe_claim(claim)} is stale (#{why}): held for a person " \
                      "(IdempotentJob.resolve / rake idempotent_job:resolve)")
          false
        when :skip
          fenced(:give_up, claim, via:)
          emit(:given_up, claim)
          logger.warn("idempotent_job: #{describe_claim(claim)} is stale (#{why}): given up, not run")
          false
        else
          logger.warn("idempotent_job: took over the stale claim of #{describe_claim(claim)} (#{why}): " \
                      "running it again (if the holder had done the effect, this is a duplicate)")
          true
        end
      end

      def ask_lookup(job_instance, options, claim, via)
        answer = job_instance.public_send(options.lookup, claim.operation_key)
        symbol = answer.respond_to?(:to_sym) ? answer.to_sym : nil
        unless Options::LOOKUP_ANSWERS.include?(symbol)
          raise LookupError, "lookup ##{options.lookup} of #{describe_claim(claim)} answered #{answer.inspect}; " \
                             "expected :done, :not_done or :unknown"
        end
        logger.info("idempotent_job: lookup ##{options.lookup} of #{describe_claim(claim)} answered :#{symbol}")
        emit(:lookup, claim, answer: symbol)
        symbol
      rescue StandardError => e
        expire_after_lookup_failure(claim, e, via)
        raise if e.is_a?(LookupError)

        raise LookupError, "lookup ##{options.lookup} of #{describe_claim(claim)} raised #{e.class}: " \
                           "#{e.message}; the job was not run, the next delivery asks again"
      end

      def expire_after_lookup_failure(claim, error, via)
        logger.error("idempotent_job: lookup of #{describe_claim(claim)} failed (#{error.class}: #{error.message}); " \
                     "not run, the claim stays stale for the next delivery")
        fenced(:expire, claim, "lookup failed: #{error.class}: #{error.message}"[0, ERROR_TEXT_LIMIT], via:)
      rescue IdempotentJob::Error => e
        logger.error("idempotent_job: could not end the lease of #{describe_claim(claim)} (#{e.message}); " \
                     "it ends by itself")
      end

      def fenced(change, claim, text = nil, via: store)
        via.fenced(change, claim.job_type, claim.operation_key, claim.token, text)
      end

      def run_claimed(options, claim)
        heartbeat = start_heartbeat(options, claim)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        begin
          result = begin
            yield
          ensure
            # Before the release or completion, and also on Thread#kill and throw (which
            # skip rescue): a dead job's lease must run out.
            stop_heartbeat(heartbeat, claim)
          end
        rescue Exception => e # rubocop:disable Lint/RescueException -- re-raised; the claim must not stay held
          release(claim, e)
          raise
        end
        complete(claim, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
        result
      end

      def start_heartbeat(options, claim)
        return nil unless options.heartbeat

        HeartbeatWatch.watch(store.heartbeat(claim.job_type, claim.operation_key, claim.token, options.lease.to_f,
                                             options.max_run.to_f), claim)
      end

      def stop_heartbeat(heartbeat, claim)
        return unless heartbeat

        report = HeartbeatWatch.stop(heartbeat)

        if report[:lost]
          emit(:lost_claim, claim, during: :heartbeat)
          logger.error("idempotent_job: lost the claim of #{describe_claim(claim)} while it ran: a renewal " \
                       "found it taken over")
        elsif report[:max_run_reached]
          logger.warn("idempotent_job: #{describe_claim(claim)} ran longer than its max_run; its lease " \
                      "was no longer renewed")
        end
      end

      # Records the completion, retrying briefly. The body has run: whatever goes wrong
      # now (connection lost, a lock or statement timeout, a read-only failover) must not
      # send the job to Sidekiq's retry, which would repeat its effect. If the completion
      # still cannot be written, the record stays claimed and its lease decides what a
      # later delivery does. Only a lost claim is raised: another delivery owns it now.
      def complete(claim, duration)
        failures = 0
        begin
          fenced(:complete, claim)
          emit(:completed, claim, duration:)
        rescue IdempotentJob::LostClaimError => e
          emit(:lost_claim, claim, during: :completion)
          logger.error("idempotent_job: #{describe_claim(claim)} ran, but lost its claim: #{e.message}")
          raise
        rescue IdempotentJob::Error => e
          delay = COMPLETION_RETRY_DELAYS[failures]
          failures += 1
          if delay
            sleep(delay)
            retry
          end
          logger.error("idempotent_job: #{describe_claim(claim)} ran, but its completion could not " \
                       "be recorded after #{failures} attempts (#{e.class}: #{e.message}); the record stays " \
                       "claimed until its lease ends, after which a redelivery would run it again")
        end
      end

      def release(claim, error)
        if shutdown?(error)
          logger.warn("idempotent_job: Sidekiq is shutting down: the claim of #{describe_claim(claim)} " \
                      "is kept until its lease ends")
          return
        end
        fenced(:release, claim, "#{error.class}: #{error.message}"[0, ERROR_TEXT_LIMIT])
        emit(:released, claim, error: error.class.name)
      rescue IdempotentJob::Error => e
        logger.error("idempotent_job: could not release the claim of #{describe_claim(claim)} " \
                     "(#{e.class}: #{e.message}); it stays claimed until its lease ends")
      end

      def shutdown?(error)
        return false unless defined?(::Sidekiq::Shutdown)

        seen = []
        while error && !seen.include?(error)
          return true if error.is_a?(::Sidekiq::Shutdown)

          seen << error
          error = error.cause
        end
        false
      end

      def skip(scope, key, job_hash, decision)
        state = { completed: "already completed", held: "held for a person", given_up: "given up",
                  refused: "not claimable by this payload" }.fetch(decision[:decision])
        logger.info("idempotent_job: #{describe(scope, key, job_hash)} is #{state}; " \
                    "duplicate delivery skipped (#{decision[:duplicates]} so far)")
        emit_delivery(:skipped, scope, key, job_hash, decision: decision[:decision], duplicates: decision[:duplicates])
        nil
      end

      def defer(scope, key, job_hash, decision)
        delay = decision[:lease_remaining] + IdempotentJob.configuration.defer_margin
        if defined?(::Sidekiq::Testing) && ::Sidekiq::Testing.inline?
          raise IdempotentJob::Error, "#{describe(scope, key, job_hash)} is in progress under jid " \
                                      "#{decision[:holder_jid]}; inline testing cannot defer it"
        end
        deferrals = job_hash.fetch("idempotency_deferrals", 0) + 1
        pushed = ::Sidekiq::Client.push(job_hash.merge("at" => Time.now.to_f + delay,
                                                       "idempotency_deferrals" => deferrals))
        # A client middleware that stops the push would lose the delivery: fail it instead.
        raise IdempotentJob::Error, "#{describe(scope, key, job_hash)}: the deferred copy was not pushed" unless pushed

        logger.info("idempotent_job: #{describe(scope, key, job_hash)} is in progress under jid " \
                    "#{decision[:holder_jid]}; delivery deferred by #{delay.round(1)} s, until its lease ends")
        emit_delivery(:deferred, scope, key, job_hash, delay:, holder_jid: decision[:holder_jid])
        nil
      end
    end

    # Client middleware: checks at enqueue time that a job's arguments yield an
    # operation key, so a bad declaration or a missing argument fails in the caller of
    # `perform_async` rather than in the worker. Touches no database. Payloads that were
    # enqueued before (Sidekiq's retry and scheduled pollers, the gem's own deferrals)
    # are not checked again: raising there would drop the job from Redis for good.
    class ClientMiddleware
      # @param job_class [Class, String] the job class or its name
      # @param job [Hash] the job payload
      # @param _queue [String]
      # @param _redis_pool [ConnectionPool, nil]
      # @yield pushes the job
      # @raise [OperationKeyError, ConfigurationError] when the job would fail its claim
      def call(job_class, job, _queue, _redis_pool = nil)
        return yield if job.key?("enqueued_at")

        klass = job_class.is_a?(Class) ? job_class : constantize(job_class.to_s)
        # A producer that does not load the job class cannot resolve parameter names:
        # the worker checks the key before the body runs.
        Options.resolve(klass, job)&.key&.operation_key(job["args"]) if klass
        yield
      end

      private

      def constantize(name)
        Object.const_get(name)
      rescue NameError
        nil
      end
    end

    # Adds the middleware to Sidekiq's chains (called when this file is required).
    # @return [void]
    def self.install!
      ::Sidekiq.configure_server do |config|
        config.server_middleware { |chain| chain.add(ServerMiddleware) }
        config.client_middleware { |chain| chain.add(ClientMiddleware) }
      end
      ::Sidekiq.configure_client do |config|
        config.client_middleware { |chain| chain.add(ClientMiddleware) }
      end
    end
  end
end

IdempotentJob::Sidekiq.install!
