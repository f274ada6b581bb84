# frozen_string_literal: true

require_relative "dependency"
IdempotentJob::Dependency.require!(IdempotentJob::Dependency::ACTIVE_JOB)
require "idempotent_job"
require "idempotent_job/producer"

module IdempotentJob
  # The internals of the ActiveJob door ({IdempotentJob::ActiveJob} is its mixin): kept
  # in a module no job includes or extends, so a job's unqualified constants resolve as
  # they would without the gem.
  module ActiveJobDoor
    # Keys with the `idempotency_` prefix a serialized job may carry (written by
    # {IdempotentJob::ActiveJob#serialize}); any other is refused when it is deserialized.
    SERIALIZED_KEYS = [*Delivery::CARRIED, "idempotency_lease"].freeze

    # `perform_now` of a repeat returns the first run's stored value (`store_result:`): an
    # around_perform callback cannot change what `perform_now` returns, so the door
    # leaves the replay on the job ({Performer}) and this takes it from there.
    module Replaying
      # @return [Object] perform's value when it ran; for a replay, the stored value
      def perform_now
        @idempotency_replay = nil
        value = super
        replay = @idempotency_replay
        @idempotency_replay = nil
        replay ? replay.first : value
      end
    end

    # Declaration methods of a job class that includes {IdempotentJob::ActiveJob}.
    module ClassMethods
      # Declares the job idempotent: each operation runs once however often it is delivered.
      # @param key [Symbol, String, Integer, Array] the operation key declaration, as
      #   the Sidekiq door's `idempotency_key`: a `perform` parameter name, an argument
      #   index, a dotted path ("payload.order.id") or an Array of those
      # @param options [Hash] any other option of {JobOptions::NAMES}, without the
      #   `idempotency_` prefix (their kinds, values and meaning: the core's table,
      #   {Configuration::JOB_OPTIONS}, and the README's per-job options; `on_enqueue:
      #   :skip_completed` makes perform_later of a completed operation return false);
      #   checked here as `sidekiq_options` are ({JobOptions.check_declaration!}); unset
      #   ones take {IdempotentJob.configuration}'s defaults at first use
      # @return [Hash] the declaration
      # @raise [ConfigurationError] for a missing key, an unknown option or a bad value,
      #   naming the job
      # @raise [OperationKeyError] for a malformed key declaration; a parameter name is
      #   checked once `perform` is defined (here when it already is)
      def idempotency(key: nil, **options)
        if key.nil?
          # A misspelled key (`keys:`, `idempotency_key:`) is named as such, with the nearest
          # option, before the missing key is.
          JobOptions.check_declaration!(self, options, shape_only: true)
          raise ConfigurationError, "#{name}: idempotency needs key: the operation key, a perform parameter " \
                                    "name (key: :order_id), an argument index, a dotted path or an Array of those"
        end
        values = { key:, **options }.freeze
        JobOptions.check_declaration!(self, values, shape_only: !idempotency_perform_defined?)
        self.idempotency_values = values
      end

      # @param lease [Numeric, nil] a per-delivery lease in seconds overriding the
      #   declared one (the testing kit's short lease travels in the serialized job)
      # @return [JobOptions, nil] the resolved options (nil when not declared); built
      #   on first use and remembered ({JobOptions.resolve})
      # @raise [OperationKeyError, ConfigurationError] as {#idempotency}
      def idempotency_options(lease: nil)
        values = idempotency_values
        values && JobOptions.resolve(self, JobOptions::NAMES.map { |name| (name == :lease && lease) || values[name] })
      end

      # Checks a key declaration's parameter names once `perform` is defined.
      # @param name [Symbol] the method just defined
      # @raise [OperationKeyError] when the declaration names a parameter perform lacks
      def method_added(name)
        super
        Key.new(self, idempotency_values[:key]) if name == :perform && idempotency_values
      end

      private

      def idempotency_perform_defined?
        instance_method(:perform).owner != ::ActiveJob::Execution
      end
    end
  end
end

require_relative "active_job/arguments"
require_relative "active_job/door"
require_relative "active_job/performer"

module IdempotentJob
  # The ActiveJob door: works on any adapter (Sidekiq's, Delayed Job, Solid Queue,
  # GoodJob, inline, async…) because it hooks ActiveJob's own `around_perform`, not a
  # queue.
  #
  #   require "idempotent_job/active_job"
  #   class ChargeOrderJob < ApplicationJob
  #     include IdempotentJob::ActiveJob
  #     idempotency key: :order_id, lease: 60, on_stale: :hold
  #     def perform(order_id, cents) = Gateway.charge(order_id, cents)
  #   end
  #
  # The operation key comes from `perform`'s deserialized arguments ({ActiveJobDoor::Arguments}); the
  # job type is the class name (or `scope:`). A delivery that meets a live claim is
  # re-enqueued with `retry_job(wait: …)` (on the inline adapter it waits in place);
  # an interrupt of the worker (Sidekiq's hard shutdown, a signal) keeps the claim for
  # its lease, as a crash would. See {ActiveJobDoor::ClassMethods#idempotency} and {ActiveJobDoor::Performer}.
  #
  # The mixin adds methods only: a job that includes it sees no constant of the gem (its
  # own `Door`, `Performer` or `Arguments` inside `perform` stay its own). The door's
  # internals live in {ActiveJobDoor}, which no job includes.
  module ActiveJob
    class << self
      # @param base [Class] an ActiveJob::Base subclass (ApplicationJob or a job)
      # @raise [ConfigurationError] when `base` is not an ActiveJob class
      def included(base)
        unless job_class?(base)
          raise ConfigurationError, "#{base}: IdempotentJob::ActiveJob is for ActiveJob classes " \
                                    "(include IdempotentJob::Job in a Sidekiq job instead)"
        end
        # idempotency_key, idempotency_claim, idempotency_attempt, idempotent_transaction inside perform
        base.include(IdempotentJob::Job)
        base.extend(ActiveJobDoor::ClassMethods)
        base.class_attribute(:idempotency_values, instance_accessor: false, default: nil)
        base.around_perform { |job, block| ActiveJobDoor::Performer.new(job).call(&block) }
        base.prepend(ActiveJobDoor::Replaying)
        base.before_enqueue { |job| ActiveJobDoor::Performer.check_enqueue(job) }
        super
      end

      # Runs the block with the door passing every delivery through unprotected, on
      # this thread (and in children it forks): the testing kit's control runs.
      # @return [Object] the block's value
      def unprotected
        before = Thread.current[:idempotent_job_active_job_off]
        Thread.current[:idempotent_job_active_job_off] = true
        yield
      ensure
        Thread.current[:idempotent_job_active_job_off] = before
      end

      # @return [Boolean] whether {unprotected} is in effect on this thread
      def unprotected?
        Thread.current[:idempotent_job_active_job_off] == true
      end

      # @param klass [Object]
      # @return [Boolean] whether it is an ActiveJob job class
      def job_class?(klass)
        klass.is_a?(Class) && klass <= ::ActiveJob::Base
      end
    end

    # @return [Integer] how many times this job was deferred by a live claim so far
    def idempotency_deferrals
      @idempotency_deferrals.to_i
    end

    # @return [Numeric, nil] a lease (seconds) this job carries in its serialized form,
    #   overriding the declared one (set by the testing kit)
    attr_accessor :idempotency_lease

    # @return [String, nil] who enqueued this job ({IdempotentJob::Producer}), stamped at
    #   its first enqueue and carried in its serialized form
    attr_accessor :idempotency_producer

    # Adds the deferral count (the back-off grows with it) and a carried lease to
    # ActiveJob's serialized job.
    # @return [Hash]
    def serialize
      extra = { Delivery::DEFERRALS => @idempotency_deferrals, "idempotency_lease" => @idempotency_lease,
                Producer::KEY => @idempotency_producer }
      super.merge(extra.compact)
    end

    # @param job_data [Hash] ActiveJob's serialized job
    # @return [void]
    # @raise [ConfigurationError] for an `idempotency_*` key {#serialize} never writes
    #   (a misspelled option added by a producer), naming it and the nearest option:
    #   the delivery fails into its adapter's retry before anything is claimed
    def deserialize(job_data)
      JobOptions.check_payload!(job_data["job_class"].to_s, job_data, ActiveJobDoor::SERIALIZED_KEYS) do |key|
        raise ConfigurationError, "#{job_data["job_class"]}: #{key} in a serialized job is not taken: " \
                                  "declare it with `idempotency` on the job class"
      end
      super
      @idempotency_deferrals = job_data[Delivery::DEFERRALS]
      @idempotency_lease = job_data["idempotency_lease"]
      @idempotency_producer = job_data[Producer::KEY]
    end
  end
end

IdempotentJob::Door.register(IdempotentJob::ActiveJobDoor::Door.new)
# The testing kit, when it is loaded first, learns to replay ActiveJob classes.
require "idempotent_job/testing/active_job_subject" if defined?(IdempotentJob::Testing::Subjects)
