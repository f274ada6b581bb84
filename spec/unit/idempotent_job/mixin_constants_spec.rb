# frozen_string_literal: true

require "spec_helper"
require "idempotent_job/active_job"

# Autoloaded frameworks load before the app constants are stubbed (ActiveSupport::Concern
# would otherwise take the stubbed top-level ClassMethods for its own).
ActiveJob::Base.name

# Issue 21: a job that includes a door's mixin resolves its own unqualified constants as
# it would without the gem. An app class named `Door`, `Performer` or `Arguments`
# referenced inside `perform` used to become the gem's internal class.
RSpec.describe "Constants inside a job that includes a door's mixin" do
  # The app's own top-level classes, named like the gem's internals.
  let(:app_names) { %w[Door Performer Arguments ClassMethods OPTIONS MINIMUM_VERSION Job Key Protocol] }

  before do
    app_names.each { |name| stub_const(name, Class.new { define_singleton_method(:inspect) { "app #{name}" } }) }
  end

  # `perform` written in the class body as an app writes it (a string, so its constant
  # lookup starts at the job class as in a source file), answering its constants.
  def define_perform(klass)
    klass.class_eval(<<~RUBY, __FILE__, __LINE__ + 1)
      def perform(*) = [#{app_names.join(", ")}] # def perform(*) = [Door, Performer, …]
    RUBY
    klass
  end

  # What the same perform answers in a class without the gem (its framework's own
  # constants, e.g. Sidekiq's ClassMethods, and the app's).
  def without_gem(klass)
    define_perform(klass).new.perform(1)
  end

  it "an ActiveJob job: every unqualified constant in perform is the app's, none is the gem's" do
    job = define_perform(Class.new(ActiveJob::Base) { include IdempotentJob::ActiveJob })
    stub_const("MixinConstantsJob", job)
    job.idempotency(key: 0)
    expect(job.new.perform(1)).to eq(without_gem(Class.new(ActiveJob::Base)))
    expect(job.new.perform(1).first(3).map(&:inspect)).to eq(["app Door", "app Performer", "app Arguments"])
    gem_modules = job.ancestors.select { |m| m.name.to_s.start_with?("IdempotentJob") }
    expect(gem_modules).to include(IdempotentJob::ActiveJob, IdempotentJob::Job)
    expect(gem_modules.to_h { |m| [m, m.constants] }).to eq(gem_modules.to_h { |m| [m, []] })
  end

  it "a Sidekiq job run by the middleware (which includes IdempotentJob::Job): the same" do
    job = define_perform(Class.new { include Sidekiq::Job })
    stub_const("MixinConstantsSidekiqJob", job)
    job.sidekiq_options idempotency_key: 0
    job.perform_async(7)
    job.drain # through the server middleware, which includes IdempotentJob::Job
    expect(job.ancestors).to include(IdempotentJob::Job)
    expect(job.new.perform(1)).to eq(without_gem(Class.new { include Sidekiq::Job }))
    gem_modules = job.ancestors + job.singleton_class.ancestors
    expect(gem_modules.select { |m| m.name.to_s.start_with?("IdempotentJob") }.flat_map(&:constants)).to eq([])
  end
end
