# frozen_string_literal: true

require "rubygems"

# The names of the precompiled gems (read by extconf.rb, the Rakefile and the loader).
module IdempotentJob
  # The precompiled (platform) gems published: platform name => the Ruby ABIs ("3.1" for every
  # 3.1.x) whose extension each one holds. `rake native:gem` builds them (x86_64-linux on the
  # host's Ruby 3.1 with the testing root's 3.3 build beside it); the source gem's extconf.rb names
  # them when Rust is missing.
  PLATFORM_GEMS = { "x86_64-linux" => %w[3.1 3.3] }.freeze

  # The platform gem's name for a machine (String, e.g. "x86_64-linux"): Gem::Platform's, without
  # the "gnu" that RubyGems 3.4 and later add for glibc Linux (x86_64-linux-gnu there; a gem
  # named x86_64-linux installs on both). Reads nothing but its argument.
  def self.gem_platform(platform = Gem::Platform.local)
    Gem::Platform.new([platform.cpu, platform.os, platform.version == "gnu" ? nil : platform.version]).to_s
  end
end
