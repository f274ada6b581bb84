# frozen_string_literal: true

module IdempotentJob
  # A queue library a door needs is missing or of an unsupported version. The gem
  # depends on no queue library: each door checks its own when it is required, and
  # this error says what to add to the Gemfile. A LoadError, as a failed `require` is.
  class DependencyError < LoadError; end

  # The queue libraries the doors are written for, checked when a door is required
  # (`require "idempotent_job/sidekiq"`, `require "idempotent_job/active_job"`). The
  # gemspec names none of them, so an app on Delayed Job, Solid Queue or GoodJob does
  # not get Sidekiq and a Redis client with the ActiveJob door.
  module Dependency
    # One library a door needs: the door's feature, what it requires, the gem's name,
    # the versions supported (a Gem::Requirement) and how to read the loaded version.
    Library = Struct.new(:door, :feature, :gem_name, :label, :requirement, :version, keyword_init: true) do
      # @return [String] the Gemfile line that satisfies it
      def gemfile_line
        versions = requirement.requirements.map { |op, v| %("#{op} #{v}") }.join(", ")
        %(gem "#{gem_name}", #{versions})
      end
    end

    # The Sidekiq door's: Sidekiq 6.4 (run in CI) to 8.x (read from source, verified by hand).
    SIDEKIQ = Library.new(door: "idempotent_job/sidekiq", feature: "sidekiq", gem_name: "sidekiq", label: "Sidekiq",
                          requirement: Gem::Requirement.new(">= 6.4", "< 9"),
                          version: -> { ::Sidekiq::VERSION }).freeze
    # The ActiveJob door's: 6.1 (run in CI) to 8.x (read from source). From 6.0
    # `retry_on` counts its attempts per exception in `exception_executions`, which a
    # deferral leaves alone; 5.2 counted `executions`, which every delivery raises.
    ACTIVE_JOB = Library.new(door: "idempotent_job/active_job", feature: "active_job", gem_name: "activejob",
                             label: "ActiveJob", requirement: Gem::Requirement.new(">= 6.1", "< 9"),
                             version: -> { ::ActiveJob.gem_version.to_s }).freeze

    module_function

    # Requires the library and checks its version.
    # @param library [Library] {SIDEKIQ} or {ACTIVE_JOB}
    # @return [Gem::Version] the loaded version
    # @raise [DependencyError] when it cannot be loaded or its version is outside
    #   {Library#requirement}, naming the Gemfile line to add
    def require!(library)
      begin
        require library.feature
      rescue LoadError => e
        raise DependencyError, message(library, "cannot load it (#{e.message})")
      end
      version = Gem::Version.new(library.version.call)
      return version if library.requirement.satisfied_by?(version)

      raise DependencyError, message(library, "this process has #{library.label} #{version}")
    end

    # Whether the library is already loaded at a supported version (nothing is required).
    # @param library [Library] {SIDEKIQ} or {ACTIVE_JOB}
    # @return [Boolean]
    def loaded?(library)
      version = loaded_version(library)
      !version.nil? && library.requirement.satisfied_by?(version)
    end

    # The version of the library this process has loaded, whether supported or not
    # (nothing is required).
    # @param library [Library] {SIDEKIQ} or {ACTIVE_JOB}
    # @return [Gem::Version, nil] nil when it is not loaded (or says no version)
    def loaded_version(library)
      Gem::Version.new(library.version.call)
    rescue NameError, ArgumentError
      nil
    end

    # @param library [Library]
    # @param problem [String]
    # @return [String]
    def message(library, problem)
      "#{library.door} needs #{library.label} #{library.requirement}, but #{problem}: add " \
        "`#{library.gemfile_line}` to your Gemfile (idempotent_job itself depends on no queue library)"
    end
  end
end
