# frozen_string_literal: true

module IdempotentJob
  class Web
    # The pages as an "Idempotency" tab of Sidekiq Web (the only file of the web page
    # that knows Sidekiq). Registered when this file loads after `require "sidekiq/web"`
    # (`require "idempotent_job/web"` does that), or by {register}. Each route of
    # {Actions::ROUTES} becomes a Sidekiq Web route under `/idempotency`, rendered inside
    # Sidekiq's layout; POSTs are protected by Sidekiq Web's own CSRF check (6.x/7.x: its
    # session token, which {View#csrf_field} puts in the forms; 8.x: its same-origin
    # check), and the inline `<style>` carries Sidekiq's CSP nonce where it has one.
    #
    # Registration follows each Sidekiq's extension API: 8.x
    # `Sidekiq::Web.configure { |c| c.register_extension(…) }`, 7.3 the keyword form of
    # `Sidekiq::Web.register`, before 7.3 `Sidekiq::Web.register` plus `Sidekiq::Web.tabs`.
    module SidekiqTab
      # The tab's label and its path under Sidekiq Web.
      TAB = "Idempotency"
      INDEX = "idempotency"

      class << self
        # Adds the tab to Sidekiq Web (requires "sidekiq/web"); once per process.
        # @return [Boolean] true when registered now, false when it already was
        def register
          require "sidekiq/web"
          return false if @registered

          @registered = true
          version = Gem::Version.new(::Sidekiq::VERSION)
          if version >= Gem::Version.new("8.0")
            ::Sidekiq::Web.configure { |config| config.register_extension(self, name: INDEX, tab: TAB, index: INDEX) }
          elsif version >= Gem::Version.new("7.3")
            ::Sidekiq::Web.register(self, name: INDEX, tab: TAB, index: INDEX)
          else
            ::Sidekiq::Web.register(self)
            ::Sidekiq::Web.tabs[TAB] = INDEX
          end
          true
        end

        # Sidekiq Web's extension hook: defines the routes on its application class.
        # @param app [Class] Sidekiq's web application class
        # @return [void]
        def registered(app)
          Actions::ROUTES.each_key do |verb, path|
            app.public_send(verb, "/#{INDEX}#{path}") do
              result = IdempotentJob::Web::SidekiqTab.respond(self, verb, path)
              case result.first
              when :redirect then redirect(result.last)
              when :text then [result[1], { "content-type" => result[2] }, [result.last]]
              when :csv
                [200, { "content-type" => "text/csv; charset=utf-8",
                        "content-disposition" => %(attachment; filename="#{result[1]}") }, [result.last]]
              else
                @idempotent_job_page = result.last
                html = erb("<%= @idempotent_job_page %>")
                result[1] == 200 ? html : [result[1], { "content-type" => "text/html; charset=utf-8" }, [html]]
              end
            end
          end
        end

        # Runs one route for a Sidekiq Web action.
        # @param action [Object] Sidekiq's action (root_path, csrf_tag, request, csp_nonce)
        # @param verb [Symbol]
        # @param path [String] the route under the tab
        # @return [Array] what {Actions#call} returns
        def respond(action, verb, path)
          nonce = action.respond_to?(:csp_nonce) ? action.csp_nonce : nil
          view = View.new(base: "#{action.root_path}#{INDEX}", csrf_field: action.csrf_tag, nonce:, layout: false)
          Actions.new.call(verb, path, action.request.params, view)
        end
      end
    end
  end
end

IdempotentJob::Web::SidekiqTab.register if defined?(Sidekiq::Web)
