# frozen_string_literal: true

module IdempotentJob
  module Sidekiq
    # Reads a Sidekiq job's idempotency options: from the job hash (where Sidekiq
    # merges `sidekiq_options` at enqueue, and `set(...)` overrides them per push), else
    # from the class; resolved, validated and remembered by {JobOptions.resolve}.
    module Options
      # Option names in the job hash, by {JobOptions::NAMES} (`idempotency_lease`).
      KEYS = JobOptions::NAMES.zip(JobOptions::PAYLOAD_NAMES).to_h.freeze
      # Every prefixed key a job hash may carry: the options and {Delivery::CARRIED} (as a
      # Hash, for a fast `key?`); a declaration takes the options only. A payload's other
      # prefixed keys (a misspelled option in `set(...)`, or in a hash pushed by class name
      # or by another language's producer) are refused by {JobOptions.check_payload!} over
      # this, at a producer's push ({ClientMiddleware}) and at every delivery ({ServerMiddleware}).
      KNOWN_HASH_KEYS = (JobOptions::PAYLOAD_NAMES + Delivery::CARRIED).to_h { |key| [key, true] }.freeze
      # Job classes {.warn_keyless} has warned about in this process, keyed by the class
      # itself: anonymous classes (name nil) are each warned once.
      KEYLESS_WARNED = {} # rubocop:disable Style/MutableConstant

      class << self
        # @param job_class [Class, String] the job class (or its name if not loadable)
        # @param job_hash [Hash] Sidekiq's job payload
        # @return [JobOptions, nil] nil for jobs without `idempotency_key` (passed through)
        # @raise [OperationKeyError] for a malformed key declaration
        # @raise [ConfigurationError] for a bad lease, scope, policy, heartbeat or lookup
        def resolve(job_class, job_hash)
          declared = job_class.respond_to?(:get_sidekiq_options) ? job_class.get_sidekiq_options : nil
          values = JobOptions::PAYLOAD_NAMES.map { |key| job_hash.fetch(key) { declared&.[](key) } }
          JobOptions.resolve(job_class, values, prefix: JobOptions::PREFIX)
        end

        # Warns, once per job class in this process, at a producer's push of a job that
        # gives `idempotency_*` options but no `idempotency_key` (by `sidekiq_options`,
        # inherited, or `set(...)`): such a job passes through unguarded, its options
        # ignored. A warning, not a refusal: a base class's `idempotency_*` defaults are
        # legitimate for subclasses that are not idempotent, and a push must not start
        # failing in production. Called by {ClientMiddleware} when {.resolve} found no key.
        # The warning says how to silence it: declare the key, remove the options, or set
        # them to nil in the class (a subclass of a base with `idempotency_*` defaults: a nil
        # option counts as not given).
        # @param job_class [Class]
        # @param job_hash [Hash] the payload being pushed
        # @return [Boolean] whether a warning was written (the first push of such a class)
        def warn_keyless(job_class, job_hash)
          declared = job_class.respond_to?(:get_sidekiq_options) ? job_class.get_sidekiq_options : nil
          given = JobOptions::PAYLOAD_NAMES.reject { |key| job_hash.fetch(key) { declared&.[](key) }.nil? }
          return false if given.empty? || KEYLESS_WARNED.key?(job_class)

          KEYLESS_WARNED[job_class] = true
          nils = given.map { |key| "#{key}: nil" }.join(", ")
          IdempotentJob.logger.warn(
            "idempotent_job: #{job_class}: #{given.join(", ")} without #{KEYS[:key]}: the job runs unguarded; " \
            "declare #{KEYS[:key]} (a perform parameter name, an argument index, a dotted path or an Array of " \
            "those), remove the #{JobOptions::PREFIX}* options, or, inherited from a base class, set them to nil " \
            "in the class (sidekiq_options #{nils}) to silence this warning"
          )
          true
        end
      end

      # Prepended to Sidekiq's `sidekiq_options` (see {.install!}): a misspelled
      # `idempotency_*` option or a value of the wrong type fails where the class is
      # declared, naming the job, the option and the known ones ({JobOptions.check_declaration!}).
      module Declaration
        # @param opts [Hash] Sidekiq's options (any keys; only `idempotency_*` are checked)
        # @return [Hash] what Sidekiq's `sidekiq_options` returns
        # @raise [ConfigurationError] for an unknown `idempotency_*` option or a bad value
        def sidekiq_options(opts = {})
          JobOptions.check_declaration!(self, opts, prefix: JobOptions::PREFIX) if opts.is_a?(Hash)
          super
        end
      end

      # Prepends {Declaration} to the module that defines `sidekiq_options` for every
      # Sidekiq job class (and ActiveJob classes with Sidekiq's adapter), including
      # classes declared before (Ruby 3 prepends into modules already extended).
      # @return [void]
      def self.install!
        target = Compat.job_module::Options::ClassMethods
        target.prepend(Declaration) unless target <= Declaration
      end
    end
  end
end
