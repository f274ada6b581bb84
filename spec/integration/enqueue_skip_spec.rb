# frozen_string_literal: true

require "spec_helper"
require "sidekiq/api"
require "sidekiq/scheduled"
require_relative "../support/active_job_jobs"
require_relative "../support/delayed_job_setup"

# Reject at enqueue (`idempotency_on_enqueue: :skip_completed`, ActiveJob
# `on_enqueue: :skip_completed`): the real Sidekiq client against the suite's Redis,
# and ActiveJob on the Delayed Job adapter (rows in delayed_jobs), against the real
# records.
class SkipCompletedJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, idempotency_on_enqueue: :skip_completed, queue: "enqueue_skip"

  def perform(order_id, _cents) = Effects.record("SkipCompletedJob", order_id)
end

# The same job without the option: every push is queued.
class PushAlwaysJob
  include Sidekiq::Job
  sidekiq_options idempotency_key: :order_id, queue: "enqueue_skip"

  def perform(order_id, _cents) = Effects.record("PushAlwaysJob", order_id)
end

# An ActiveJob job that opts in.
class SkipCompletedActiveJob < ActiveJob::Base
  include IdempotentJob::ActiveJob
  idempotency key: :order_id, on_enqueue: :skip_completed

  def perform(order_id) = Effects.record("SkipCompletedActiveJob", order_id)
end

RSpec.describe "Reject at enqueue (on_enqueue: :skip_completed)", :integration do
  let(:queue) { Sidekiq::Queue.new("enqueue_skip") }
  let(:events) { [] }
  let(:log) { StringIO.new }

  before do
    SpecServices.configure_gem!(logger: Logger.new(log))
    @subscription = IdempotentJob.subscribe(:enqueue_skipped) { |name, payload| events << [name, payload] }
  end

  after { IdempotentJob.unsubscribe(@subscription) }

  def completed!(job_type, key)
    token = claim(job_type, key, "first", 30).fetch(:token)
    complete(job_type, key, token)
  end

  def enqueued_jids
    queue.map(&:jid)
  end

  describe "Sidekiq, through the real client into Redis" do
    around do |example|
      Sidekiq::Testing.disable! do
        queue.clear
        Sidekiq::ScheduledSet.new.clear
        example.run
        queue.clear
        Sidekiq::ScheduledSet.new.clear
      end
    end

    it "perform_async of a completed operation returns nil, pushes nothing, logs and publishes one event" do
      key = rand(1 << 40)
      completed!("SkipCompletedJob", key.to_s)

      expect(SkipCompletedJob.perform_async(key, 100)).to be_nil
      expect(queue.size).to eq(0)
      expect(log.string).to include(%(SkipCompletedJob operation "#{key}" is already completed: push to "enqueue_skip"))
      expect(events.size).to eq(1)
      name, payload = events.first
      expect(name).to eq(:enqueue_skipped)
      expect(payload).to include(job_type: "SkipCompletedJob", operation_key: key.to_s, job_class: "SkipCompletedJob",
                                 queue: "enqueue_skip", door: :sidekiq, outcome: :rejected_at_enqueue)
      expect(payload[:duration]).to be_a(Float)

      # Without the option, the same completed operation is pushed (and turned away at delivery).
      completed!("PushAlwaysJob", key.to_s)
      expect(PushAlwaysJob.perform_async(key, 100)).to be_a(String)
      expect(queue.size).to eq(1)
    end

    it "pushes an operation that is not completed: no record, claimed, released, held, given up" do
      keys = { none: nil, claimed: nil, released: :release, held: :hold, given_up: :give_up }.map do |state, change|
        key = "#{state}-#{rand(1 << 40)}"
        unless state == :none
          token = claim("SkipCompletedJob", key, "first", 30).fetch(:token)
          RecordRows.fenced(change, "SkipCompletedJob", key, token, change == :release ? "boom" : nil) if
            change
        end
        key
      end
      jids = keys.map { |key| SkipCompletedJob.perform_async(key, 1) }

      expect(jids).to all(be_a(String))
      expect(enqueued_jids).to match_array(jids)
      expect(events).to be_empty
    end

    it "never drops a scheduled job coming due (the poller's push), a retry or a deferral's re-push" do
      key = rand(1 << 40)
      scheduled = SkipCompletedJob.perform_in(0.5, key, 1) # not completed yet: scheduled
      expect(scheduled).to be_a(String)
      completed!("SkipCompletedJob", key.to_s)

      sleep 0.6 # until it is due
      # Sidekiq's own poller moves it to the queue (6.4: Enq.new; 7+: Enq.new(config)).
      enq = Sidekiq::Scheduled::Enq.instance_method(:initialize).arity.zero? ? Sidekiq::Scheduled::Enq.new : nil
      enq ||= Sidekiq::Scheduled::Enq.new(Sidekiq.default_configuration)
      enq.enqueue_jobs
      expect(enqueued_jids).to eq([scheduled])

      # What the retry poller and the door's deferral push: the payload by class name,
      # already enqueued once (a deferral adds `at` and its count).
      payload = queue.first.item
      retried = payload.merge("retry_count" => 0, "error_class" => "RuntimeError")
      deferred = payload.merge("at" => Time.now.to_f + 60, IdempotentJob::Sidekiq::Door::DEFERRALS => 1)
      expect(Sidekiq::Client.push(retried)).to eq(scheduled)
      expect(Sidekiq::Client.push(deferred)).to eq(scheduled)
      expect(Sidekiq::ScheduledSet.new.map(&:jid)).to eq([scheduled])
      expect(queue.size).to eq(2)
      expect(events).to be_empty
    end

    it "reads the option per push too (set(...)), and refuses an unknown policy naming the job" do
      key = rand(1 << 40)
      completed!("PushAlwaysJob", key.to_s)
      expect(PushAlwaysJob.set(idempotency_on_enqueue: "skip_completed").perform_async(key, 1)).to be_nil
      expect(queue.size).to eq(0)
      expect { PushAlwaysJob.set(idempotency_on_enqueue: :skip).perform_async(key, 1) }
        .to raise_error(IdempotentJob::ConfigurationError,
                        /PushAlwaysJob: idempotency_on_enqueue must be one of push, skip_completed, got :skip/)
    end

    it "pushes when the database cannot answer, with a warning (the delivery's claim still decides)" do
      SpecServices.configure_gem!(logger: Logger.new(log), database_url: "postgres://nobody@127.0.0.1:1/none",
                                  connect_timeout: 1)
      expect(SkipCompletedJob.perform_async(rand(1 << 40), 1)).to be_a(String)
      expect(queue.size).to eq(1)
      expect(log.string).to match(/the on_enqueue check failed \(IdempotentJob::ConnectionError: .*pushed anyway/)
    end
    it "pushes within enqueue_check_timeout when PostgreSQL never answers (SIGSTOP), not after the deadline" do
      SpecServices.configure_gem!(logger: Logger.new(log))
      expect(SkipCompletedJob.perform_async(rand(1 << 40), 1)).to be_a(String) # a pooled connection
      data = Effects.connection.exec("SHOW data_directory").getvalue(0, 0)
      postmaster = Integer(File.read(File.join(data, "postmaster.pid")).split.first)
      pids = [postmaster, *File.read("/proc/#{postmaster}/task/#{postmaster}/children").split.map(&:to_i)]
      begin
        pids.each { |pid| Process.kill(:STOP, pid) }
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        expect(SkipCompletedJob.perform_async(rand(1 << 40), 1)).to be_a(String)
        seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      ensure
        pids.each { |pid| Process.kill(:CONT, pid) rescue Errno::ESRCH } # rubocop:disable Style/RescueModifier
      end
      # Before: the 10 s deadline (8.3 s seen). The default bound is 0.5 s; 1 s more for a loaded machine.
      expect(seconds).to be < 1.5
      expect(queue.size).to eq(2)
      expect(log.string).to match(/the on_enqueue check failed \(IdempotentJob::TimeoutError: .*pushed anyway/)
    end
  end

  describe "ActiveJob on the Delayed Job adapter" do
    before(:all) do
      ActiveRecord::Base.establish_connection(SpecServices.database_url) unless ActiveRecord::Base.connected?
      DelayedJobSetup.create_table!
    end

    around do |example|
      before = ActiveJob::Base.queue_adapter
      ActiveJob::Base.queue_adapter = :delayed_job
      DelayedJobSetup.clear!
      example.run
    ensure
      DelayedJobSetup.clear!
      ActiveJob::Base.queue_adapter = before
    end

    it "perform_later of a completed operation returns false and enqueues nothing; others are enqueued" do
      key = rand(1 << 40)
      completed!("SkipCompletedActiveJob", key.to_s)

      expect(SkipCompletedActiveJob.perform_later(key)).to be(false)
      expect(Delayed::Job.count).to eq(0)
      expect(events.map { |_, payload| payload.values_at(:operation_key, :door) }).to eq([[key.to_s, :active_job]])
      expect(log.string).to include(%(SkipCompletedActiveJob operation "#{key}" is already completed))

      fresh = SkipCompletedActiveJob.perform_later(key + 1)
      expect(fresh).to be_a(SkipCompletedActiveJob)
      expect(Delayed::Job.count).to eq(1)
    end

    it "never drops a re-enqueue of a job that was performed (retry_on, the door's deferral)" do
      key = rand(1 << 40)
      completed!("SkipCompletedActiveJob", key.to_s)
      job = SkipCompletedActiveJob.new(key)
      job.executions = 1 # performed once: what retry_job re-enqueues
      # The job itself on ActiveJob 6.1, an enqueued copy of it from 7.1 (`retry_job` enqueues
      # `dup`); false would mean the enqueue check halted it.
      expect(job.retry_job(wait: 60)).to be_a(SkipCompletedActiveJob).and have_attributes(job_id: job.job_id)
      expect(Delayed::Job.count).to eq(1)
      expect(events).to be_empty
    end

    it "refuses an unknown on_enqueue at declaration, naming the job" do
      expect do
        Class.new(ActiveJob::Base) do
          def self.name = "BadEnqueueJob"
          include IdempotentJob::ActiveJob
          idempotency key: :order_id, on_enqueue: :drop
        end
      end.to raise_error(IdempotentJob::ConfigurationError, /BadEnqueueJob: on_enqueue must be one of/)
    end
  end
end
