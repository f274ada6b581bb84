# frozen_string_literal: true

# A -r prelude (`ruby -r ./spec/support/hide_sidekiq.rb …`) for a process where
# Sidekiq is not installed: `require "sidekiq"` (and any "sidekiq/…" or the redis
# clients it brings) raises LoadError, as it does in an app whose Gemfile lacks them.
module HideSidekiq
  # Features that fail to load in this process.
  HIDDEN = %r{\A(sidekiq|redis|redis-client|redis_client)(/|\z)}

  def require(name)
    raise LoadError, "cannot load such file -- #{name} (hidden by spec/support/hide_sidekiq.rb)" if
      HIDDEN.match?(name.to_s)

    super
  end
end

Kernel.prepend(HideSidekiq)
Object.prepend(HideSidekiq)
